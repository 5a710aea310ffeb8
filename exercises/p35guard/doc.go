// Package p35guard holds the chapter's drills on the guard package, one test
// or benchmark per exercise. Each comment states the question and its
// answer; the test proves the answer on the manual clock. README.md lists
// them with the commands.
package p35guard
