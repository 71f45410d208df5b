package devstack_test

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
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
		devstack.InitEdgeToken, devstack.InitWebhookSecret, devstack.InitReviewers, devstack.InitN8NCredentials, devstack.InitN8NSettings} {
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
	ID       string         `json:"id"`
	Settings map[string]any `json:"settings"`
	Nodes    []struct {
		ID          string         `json:"id"`
		Name        string         `json:"name"`
		Type        string         `json:"type"`
		Parameters  map[string]any `json:"parameters"`
		RetryOnFail bool           `json:"retryOnFail"`
		Credentials map[string]struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"credentials"`
	} `json:"nodes"`
	Connections map[string]map[string][][]struct {
		Node string `json:"node"`
	} `json:"connections"`
}

// The shipped workflows run unchanged wherever they are imported: no
// address in them, every secret in a credential the import writes, the
// webhooks answer after the work and keep no run data (their headers hold
// the secret), and client errors are never retried.
func TestShippedWorkflowsAreConsistent(t *testing.T) {
	files, err := filepath.Glob("../n8n/workflows/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no shipped workflows: %v", err)
	}
	creds := map[string]string{} // id → name, as the import writes them
	var written []struct{ ID, Name, Type string }
	dir := t.TempDir()
	f, err := devstack.WriteN8N(dir, devstack.N8NOptions{EdgeURL: "http://edge:8480", EdgeToken: strings.Repeat("t", 16),
		EventSecret: strings.Repeat("e", 16), IntakeSecret: strings.Repeat("i", 16)}, -1)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(readFile(t, f.Credentials)), &written); err != nil {
		t.Fatal(err)
	}
	for _, c := range written {
		creds[c.ID] = c.Name
	}
	ids := map[string]bool{devstack.N8NSettingsWorkflowID: true}
	var wfs []workflow
	for _, file := range files {
		text := readFile(t, file)
		if strings.Contains(text, "8480") || strings.Contains(text, "edge:") {
			t.Errorf("%s names an address: the edge's comes from the settings workflow", file)
		}
		var wf workflow
		if err := json.Unmarshal([]byte(text), &wf); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		ids[wf.ID] = true
		wfs = append(wfs, wf)
	}
	compose := readFile(t, "../../compose.yaml")
	if !strings.Contains(compose, "/opt/n8nbrain/import.sh /state/n8n") {
		t.Error("compose.yaml does not import with deploy/n8n/import.sh")
	}
	hookURL := regexp.MustCompile(`EDGE_WEBHOOK_URL: (\S+)`).FindStringSubmatch(compose)
	if hookURL == nil || hookURL[1] != "http://n8n:5678/webhook/brain-events" {
		t.Errorf("compose.yaml's EDGE_WEBHOOK_URL %v, want the events workflow's webhook", hookURL)
	}
	customNodes := shippedNodes(t)
	if !strings.Contains(compose, "N8N_CUSTOM_EXTENSIONS: /opt/n8nbrain/nodes") || !strings.Contains(compose, "./deploy/n8n/nodes:/opt/n8nbrain/nodes:ro") {
		t.Error("compose.yaml's n8n does not load deploy/n8n/nodes")
	}
	sendsReply := false
	var paths []string
	for _, wf := range wfs {
		names := map[string]bool{}
		for _, n := range wf.Nodes {
			if names[n.Name] {
				t.Errorf("%s: node %q is listed twice", wf.ID, n.Name)
			}
			names[n.Name] = true
			for typ, c := range n.Credentials {
				if creds[c.ID] != c.Name {
					t.Errorf("%s: node %q uses credential %s %q, which the import does not write", wf.ID, n.Name, typ, c.ID)
				}
			}
			switch n.Type {
			case "n8n-nodes-base.webhook":
				paths = append(paths, n.Parameters["path"].(string))
				want := devstack.N8NIntakeCredentialID
				if n.Parameters["path"] == "brain-events" {
					want = devstack.N8NEventCredentialID
				}
				if n.Parameters["authentication"] != "headerAuth" || n.Credentials["httpHeaderAuth"].ID != want {
					t.Errorf("%s: webhook %q is not protected by credential %s", wf.ID, n.Name, want)
				}
				if n.Parameters["responseMode"] != "responseNode" {
					t.Errorf("%s: webhook %q answers before the work is done", wf.ID, n.Name)
				}
				if wf.Settings["saveDataSuccessExecution"] != "none" || wf.Settings["saveDataErrorExecution"] != "none" {
					t.Errorf("%s keeps run data, and its webhook's headers hold a secret", wf.ID)
				}
			case "n8n-nodes-base.httpRequest":
				u, _ := n.Parameters["url"].(string)
				if !strings.Contains(u, "edge_url") {
					t.Errorf("%s: HTTP request %q calls %q, not the settings' edge_url", wf.ID, n.Name, u)
				}
				resp, _ := n.Parameters["options"].(map[string]any)["response"].(map[string]any)["response"].(map[string]any)
				if n.RetryOnFail && (resp["neverError"] != true || resp["fullResponse"] != true) {
					t.Errorf("%s: HTTP request %q retries answers: an edge error would be sent again", wf.ID, n.Name)
				}
			case "n8n-nodes-base.executeWorkflow":
				id := n.Parameters["workflowId"].(map[string]any)["value"].(string)
				if !ids[id] {
					t.Errorf("%s: node %q calls workflow %s, which is not shipped", wf.ID, n.Name, id)
				}
			case "n8n-nodes-base.emailSend":
				if opts, _ := n.Parameters["options"].(map[string]any); opts["appendAttribution"] != false {
					t.Errorf("%s: %q appends n8n's attribution: the sent text would not be the approved one", wf.ID, n.Name)
				}
			default:
				// A node of ours (N8N_CUSTOM_EXTENSIONS=deploy/n8n/nodes):
				// shipped, and loaded where n8n runs in compose.
				if name, ok := strings.CutPrefix(n.Type, "CUSTOM."); ok {
					if !customNodes[name] {
						t.Errorf("%s: node %q is of type %s, which deploy/n8n/nodes does not define", wf.ID, n.Name, n.Type)
					}
					if name == "n8nbrainSendReply" {
						sendsReply = true
					}
				}
			}
		}
		for from, outs := range wf.Connections {
			if !names[from] {
				t.Errorf("%s: connection from unknown node %q", wf.ID, from)
			}
			for _, out := range outs["main"] {
				for _, to := range out {
					if !names[to.Node] {
						t.Errorf("%s: connection from %q to unknown node %q", wf.ID, from, to.Node)
					}
				}
			}
		}
	}
	slices.Sort(paths)
	if !slices.Equal(paths, []string{"brain-events", "human-reply", "new-email"}) {
		t.Errorf("webhook paths %q", paths)
	}
	if !sendsReply {
		t.Error("no workflow sends with the Send Reply node: approved replies would go out unthreaded")
	}
}

// shippedNodes are the node names deploy/n8n/nodes defines (the name in
// each *.node.js file's description; make e2e loads them in n8n).
func shippedNodes(t *testing.T) map[string]bool {
	files, err := filepath.Glob("../n8n/nodes/*.node.js")
	if err != nil || len(files) == 0 {
		t.Fatalf("no nodes in deploy/n8n/nodes: %v", err)
	}
	names := map[string]bool{}
	for _, f := range files {
		m := regexp.MustCompile(`(?m)^\t\t\tname: '([A-Za-z0-9]+)',$`).FindStringSubmatch(readFile(t, f))
		if m == nil {
			t.Fatalf("%s: no description name", f)
		}
		names[m[1]] = true
	}
	return names
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
