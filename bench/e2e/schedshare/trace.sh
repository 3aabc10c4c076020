#!/bin/bash
# trace.sh start | stop OUT: record every CPU's sched_switch events in an ftrace
# instance of its own (clock "tai", 400 MB per CPU), for schedshare. Root; mounts
# tracefs if needed. "stop" writes the trace to OUT and removes the instance.
set -euo pipefail
T=/sys/kernel/tracing
[ -e $T/instances ] || mount -t tracefs nodev $T
I=$T/instances/schedshare
case ${1:-} in
start)
	mkdir -p $I
	echo 0 >$I/tracing_on
	echo tai >$I/trace_clock
	echo 400000 >$I/buffer_size_kb
	echo >$I/trace
	echo 1 >$I/events/sched/sched_switch/enable
	echo 1 >$I/tracing_on
	;;
stop)
	[ -n "${2:-}" ] || { echo "usage: $0 stop OUT" >&2; exit 2; }
	echo 0 >$I/tracing_on
	cat $I/trace >"$2"
	if grep -q "LOST" "$2"; then echo "$0: the trace lost events (buffer full)" >&2; fi
	echo 0 >$I/events/enable
	rmdir $I
	;;
*)
	echo "usage: $0 start | stop OUT" >&2
	exit 2
	;;
esac
