// Package netns is a test harness that builds a small dual-stack "cluster" out of
// Linux network namespaces for real-kernel proxy tests: a Node namespace (where the
// proxy runs), Pod namespaces routed to it over veth pairs, an External client
// namespace and optionally a remote node with its own pods. Pods and the node run
// real TCP, UDP and SCTP servers that answer with their name and the client's
// observed source address, and Dial reports refused and timed-out attempts as
// distinguishable errors.
//
// Everything except this file is behind the "netns" build tag and needs root:
//
//	go test -tags netns -count=1 ./test/netns/ ./pkg/conntrack/
//
// The harness never changes the host network namespace: every namespace it uses is
// created by New and deleted by Cluster.Close (registered with t.Cleanup), and
// goroutines that enter a namespace lock their OS thread and never unlock it, so the
// Go runtime discards the thread instead of reusing it in the wrong namespace.
package netns
