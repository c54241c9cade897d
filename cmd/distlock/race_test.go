//go:build race

package main

// raceEnabled: the tests run with -race, and build distlock with it too.
const raceEnabled = true
