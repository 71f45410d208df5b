// Package usage is what the brain and edge commands do with their
// arguments. Both are configured from the environment and take at most one
// subcommand, so anything else on the command line is a mistake to report,
// not a reason to start (a replica started by `brain --help` would join the
// queue groups and take turns).
package usage

import (
	"fmt"
	"io"
)

// Check looks at a command's arguments (os.Args[1:]) when none of its
// subcommands matched. It returns run for no arguments; else it has
// printed help (code 0, for -h, -help, --help and help) or named the
// unknown argument (code 2), and the command should exit with code.
func Check(name string, args []string, help string, stdout, stderr io.Writer) (run bool, code int) {
	if len(args) == 0 {
		return true, 0
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, help)
		return false, 0
	}
	fmt.Fprintf(stderr, "%s: unknown argument %q: it takes no flags and is configured from the environment (%s --help)\n", name, args[0], name)
	return false, 2
}
