package kubeclient

// DecodeService is decodeService for the external tests (watch imports this
// package, so its CompactService can only be compared from outside).
var DecodeService = decodeService
