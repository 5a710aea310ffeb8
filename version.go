package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// buildVersion is what the Go toolchain stamped into the binary: the
// module's version (a tag, or a pseudo-version from the commit), the VCS
// revision and whether the tree had uncommitted changes.
type buildVersion struct {
	Version   string // "(devel)" or unknown when the toolchain knew none
	Revision  string // the commit, or "unknown" (go test, or a build outside a checkout)
	Modified  bool
	GoVersion string
}

// readBuildVersion reads the binary's build information.
func readBuildVersion() buildVersion {
	v := buildVersion{Version: "unknown", Revision: "unknown", GoVersion: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if info.Main.Version != "" {
		v.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is what dnsproxi -version prints.
func (v buildVersion) String() string {
	modified := ""
	if v.Modified {
		modified = ", modified"
	}
	return fmt.Sprintf("dnsproxi %s (revision %s%s, %s)", v.Version, v.Revision, modified, v.GoVersion)
}
