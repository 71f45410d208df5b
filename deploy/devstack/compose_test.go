package devstack_test

import (
	"encoding/json"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"n8nbrain/deploy/devstack"
)

// These tests keep compose.yaml, deploy/env.example and the example n8n
// workflow in step with the init step and with each other. Whether compose
// itself accepts the file is `make compose-config`'s job.

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// composeDefaults returns each ${VAR:-default} of compose.yaml.
func composeDefaults(t *testing.T, compose string) map[string]string {
	t.Helper()
	defaults := map[string]string{}
	for _, m := range regexp.MustCompile(`\$\{([A-Z0-9_]+)(?::-([^}]*))?\}`).FindAllStringSubmatch(compose, -1) {
		if prev, ok := defaults[m[1]]; ok && prev != m[2] {
			t.Errorf("compose.yaml gives %s two defaults: %q and %q", m[1], prev, m[2])
		}
		defaults[m[1]] = m[2]
	}
	return defaults
}

func TestComposeNamesTheFilesInitWrites(t *testing.T) {
	compose := readFile(t, "../../compose.yaml")
	for _, p := range []string{devstack.InitNATSConf, devstack.InitBrainCreds, devstack.InitEdgeCreds,
		devstack.InitEdgeToken, devstack.InitWebhookSecret, devstack.InitReviewers, devstack.InitN8NCredentials} {
		if !strings.Contains(compose, "/state/"+p) {
			t.Errorf("compose.yaml does not mention /state/%s, which init writes", p)
		}
	}
}

func TestComposeDefaultsPassInitAndAreDocumented(t *testing.T) {
	compose := readFile(t, "../../compose.yaml")
	example := readFile(t, "../env.example")
	defaults := composeDefaults(t, compose)
	// Every variable compose reads is documented, with the same default.
	for name, def := range defaults {
		m := regexp.MustCompile(`(?m)^` + name + `=(.*)$`).FindStringSubmatch(example)
		if m == nil {
			t.Errorf("deploy/env.example does not document %s", name)
		} else if m[1] != def {
			t.Errorf("%s: env.example says %q, compose.yaml defaults to %q", name, m[1], def)
		}
	}
	// The init service's environment with compose's defaults is valid.
	env := map[string]string{}
	block := regexp.MustCompile(`(?s)\n  init:\n.*?\n    environment:\n(.*?)\n    volumes:`).FindStringSubmatch(compose)
	if block == nil {
		t.Fatal("no environment block in compose.yaml's init service")
	}
	anchors := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^  [a-z0-9-]+: &([a-z0-9-]+) (.*)$`).FindAllStringSubmatch(compose, -1) {
		anchors[m[1]] = m[2]
	}
	expand := func(v string) string {
		v = strings.Trim(strings.TrimSpace(v), `"`)
		if strings.HasPrefix(v, "*") {
			v = anchors[v[1:]]
		}
		return regexp.MustCompile(`\$\{([A-Z0-9_]+):-([^}]*)\}`).ReplaceAllString(v, "$2")
	}
	for _, m := range regexp.MustCompile(`(?m)^      ([A-Z0-9_]+): (.*)$`).FindAllStringSubmatch(block[1], -1) {
		env[m[1]] = expand(m[2])
	}
	o, err := devstack.InitOptionsFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("init with compose's defaults: %v", err)
	}
	if o.Dir != "/state" || o.DBHost != "postgres" || o.N8NGroup != 1000 || o.NATS.StoreDir != "/data/jetstream" {
		t.Errorf("init options from compose: %+v", o)
	}
	// The registry password compose gives init is the one in the brain's URL.
	m := regexp.MustCompile(`BRAIN_REGISTRY_URL: (\S+)`).FindStringSubmatch(compose)
	if m == nil {
		t.Fatal("compose.yaml sets no BRAIN_REGISTRY_URL")
	}
	u, err := url.Parse(expand(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := u.User.Password(); pw != o.RegistryPassword || u.Host != "postgres:5432" || u.Path != "/brain_registry" {
		t.Errorf("BRAIN_REGISTRY_URL %s does not match init's registry (password %q)", u.Redacted(), o.RegistryPassword)
	}
}

type workflow struct {
	ID    string `json:"id"`
	Nodes []struct {
		ID          string         `json:"id"`
		Name        string         `json:"name"`
		Type        string         `json:"type"`
		Parameters  map[string]any `json:"parameters"`
		Credentials map[string]struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"credentials"`
	} `json:"nodes"`
	Connections map[string]map[string][][]struct {
		Node string `json:"node"`
	} `json:"connections"`
}

func TestExampleWorkflowIsConsistent(t *testing.T) {
	var wf workflow
	if err := json.Unmarshal([]byte(readFile(t, "../n8n/workflow.json")), &wf); err != nil {
		t.Fatal(err)
	}
	compose := readFile(t, "../../compose.yaml")
	if !strings.Contains(compose, "publish:workflow --id="+wf.ID+"\n") {
		t.Errorf("compose.yaml does not publish workflow %s", wf.ID)
	}
	names := map[string]bool{}
	ids := map[string]bool{}
	for _, n := range wf.Nodes {
		if names[n.Name] || ids[n.ID] {
			t.Errorf("node %q (%s) is listed twice", n.Name, n.ID)
		}
		names[n.Name], ids[n.ID] = true, true
	}
	for from, outs := range wf.Connections {
		if !names[from] {
			t.Errorf("connection from unknown node %q", from)
		}
		for _, out := range outs["main"] {
			for _, to := range out {
				if !names[to.Node] {
					t.Errorf("connection from %q to unknown node %q", from, to.Node)
				}
			}
		}
	}
	hookURL := regexp.MustCompile(`EDGE_WEBHOOK_URL: (\S+)`).FindStringSubmatch(compose)
	if hookURL == nil {
		t.Fatal("compose.yaml sets no EDGE_WEBHOOK_URL")
	}
	var paths []string
	for _, n := range wf.Nodes {
		cred, hasCred := n.Credentials["httpHeaderAuth"]
		switch n.Type {
		case "n8n-nodes-base.webhook":
			paths = append(paths, n.Parameters["path"].(string))
			if !hasCred || cred.ID != devstack.N8NHookCredentialID || cred.Name != devstack.N8NHookCredentialName || n.Parameters["authentication"] != "headerAuth" {
				t.Errorf("webhook %q is not protected by the events credential: %+v", n.Name, n.Credentials)
			}
		case "n8n-nodes-base.httpRequest":
			// POST /v1/turns, or GET of the result_url the edge returns (/v1/turns/<key>).
			if u, _ := n.Parameters["url"].(string); !strings.HasPrefix(strings.TrimPrefix(u, "="), "http://edge:8480") || !strings.Contains(u, "turns") && !strings.Contains(u, "result_url") {
				t.Errorf("HTTP request %q calls %q, not the edge's turns", n.Name, u)
			}
			if !hasCred || cred.ID != devstack.N8NEdgeCredentialID || cred.Name != devstack.N8NEdgeCredentialName {
				t.Errorf("HTTP request %q does not use the edge credential: %+v", n.Name, n.Credentials)
			}
		}
	}
	if want := "http://n8n:5678/webhook/brain-events"; hookURL[1] != want || !slices.Contains(paths, "brain-events") {
		t.Errorf("EDGE_WEBHOOK_URL %s; workflow webhook paths %q", hookURL[1], paths)
	}
}

// Every image compose.yaml runs or builds on is a variable, so a machine
// that cannot pull replaces it, and deploy/local/images.env replaces every
// one with a local image that deploy/images-local.sh builds.
func TestEveryImageIsReplacedByTheLocalImages(t *testing.T) {
	compose := readFile(t, "../../compose.yaml")
	local := readFile(t, "../local/images.env")
	var vars []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(image|GO_IMAGE|RUNTIME_IMAGE): (.*)$`).FindAllStringSubmatch(compose, -1) {
		v := regexp.MustCompile(`^\$\{([A-Z0-9_]+):-[^}]+\}$`).FindStringSubmatch(m[2])
		if v == nil {
			t.Errorf("%s %s is not a ${VAR:-default}: it cannot be replaced", m[1], m[2])
			continue
		}
		vars = append(vars, v[1])
	}
	if len(vars) < 8 {
		t.Fatalf("found only %q in compose.yaml", vars)
	}
	for _, v := range vars {
		if !regexp.MustCompile(`(?m)^` + v + `=n8nbrain-local/\S+$`).MatchString(local) {
			t.Errorf("deploy/local/images.env does not give %s a local image", v)
		}
	}
}
