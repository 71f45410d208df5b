package usage

import (
	"bytes"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		run         bool
		code        int
		out, errOut string
	}{
		{args: nil, run: true},
		{args: []string{"--help"}, out: "HELP"},
		{args: []string{"-h"}, out: "HELP"},
		{args: []string{"help"}, out: "HELP"},
		{args: []string{"--nats-url", "x"}, code: 2, errOut: `brain: unknown argument "--nats-url": it takes no flags and is configured from the environment (brain --help)`},
	} {
		var out, errOut bytes.Buffer
		run, code := Check("brain", tc.args, "HELP", &out, &errOut)
		if run != tc.run || code != tc.code || out.String() != tc.out || strings.TrimSpace(errOut.String()) != tc.errOut {
			t.Errorf("Check(%q) = %v, %d, out %q, err %q; want %v, %d, %q, %q", tc.args, run, code, out.String(), errOut.String(), tc.run, tc.code, tc.out, tc.errOut)
		}
	}
}
