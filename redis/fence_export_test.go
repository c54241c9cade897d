package redis

// FenceKey is fenceKey, for the tests of its layout.
var FenceKey = fenceKey
