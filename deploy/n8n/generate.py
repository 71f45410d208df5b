#!/usr/bin/env python3
"""Writes the shipped n8n workflows (deploy/n8n/workflows/*.json).

The workflows are data n8n imports; this script is their source, so that the
parts several workflows share are written once. Run it after a change:

    python3 deploy/n8n/generate.py

TestShippedWorkflowsAreConsistent (deploy/devstack/compose_test.go) checks
the files it writes (no edge address, credentials the import writes, every
webhook answers only after the work and keeps no run data, every workflow
the others call is shipped); `make e2e` runs them. See README.md, "n8n".
"""
import json
import os
import uuid

NS = uuid.UUID("6f1d2c1e-8a55-4b7e-9e0c-0b8f5a1d2c3e")
HERE = os.path.dirname(os.path.abspath(__file__))

# Ids the workflows call each other by; the settings workflow is written by
# devstack (deploy/devstack/n8n.go), the others are shipped.
SETTINGS = "n8nbrainSettings"
TURN = "n8nbrainTurn"
ACT = "n8nbrainAct"
EVENTS = "n8nbrainEvents"
IMAP = "n8nbrainImap"
INTAKE = "n8nbrainIntake"

# Credential ids and names, written by devstack (deploy/devstack/n8n.go).
CRED_EDGE = {"httpHeaderAuth": {"id": "n8nbrainEdgeAuth", "name": "n8nbrain edge"}}
CRED_EVENTS = {"httpHeaderAuth": {"id": "n8nbrainEventAuth", "name": "n8nbrain events (X-Brain-Webhook-Token)"}}
CRED_INTAKE = {"httpHeaderAuth": {"id": "n8nbrainIntakeAuth", "name": "n8nbrain intake (X-N8nbrain-Intake-Token)"}}
CRED_IMAP = {"imap": {"id": "n8nbrainImap", "name": "n8nbrain mailbox (IMAP)"}}
CRED_SMTP = {"smtp": {"id": "n8nbrainSmtp", "name": "n8nbrain mailbox (SMTP)"}}


def expr(code):
    """An n8n expression around JavaScript code. n8n ends an expression at
    the first "}}", so nested object literals must not close two at once."""
    while "}}" in code or "{{" in code:
        code = code.replace("}}", "} }").replace("{{", "{ {")
    return "={{ " + code + " }}"


class Workflow:
    def __init__(self, wid, name, save_data=True):
        self.id, self.name, self.nodes, self.conns = wid, name, [], {}
        self.save_data = save_data
        self.x = 0

    def node(self, name, type_, version, params, pos, **extra):
        n = {
            "parameters": params,
            "id": str(uuid.uuid5(NS, self.id + "/" + name)),
            "name": name,
            "type": type_,
            "typeVersion": version,
            "position": list(pos),
        }
        n.update(extra)
        self.nodes.append(n)
        return name

    def connect(self, src, dst, out=0):
        outs = self.conns.setdefault(src, {"main": []})["main"]
        while len(outs) <= out:
            outs.append([])
        outs[out].append({"node": dst, "type": "main", "index": 0})

    def chain(self, *names):
        for a, b in zip(names, names[1:]):
            self.connect(a, b)

    def dump(self):
        settings = {"executionOrder": "v1", "callerPolicy": "workflowsFromSameOwner"}
        if not self.save_data:
            # Webhook receivers: the request headers hold the secret n8n
            # checked, and n8n saves a webhook's headers with the run. These
            # workflows keep no run data; the work runs in sub-workflows
            # that get the body only and keep theirs.
            settings.update(saveDataSuccessExecution="none", saveDataErrorExecution="none",
                            saveManualExecutions=False, saveExecutionProgress=False)
        return {
            "id": self.id,
            "name": self.name,
            "active": False,
            "nodes": self.nodes,
            "connections": self.conns,
            "settings": settings,
            "pinData": {},
            "meta": {"templateCredsSetupCompleted": True},
            "tags": [],
        }


def note(w, name, text, pos, w_=520, h=420):
    return w.node(name, "n8n-nodes-base.stickyNote", 1, {"content": text, "height": h, "width": w_, "color": 4}, pos)


def called(w, pos):
    return w.node("Called", "n8n-nodes-base.executeWorkflowTrigger", 1.1, {"inputSource": "passthrough"}, pos)


def call(w, name, wid, pos, **extra):
    return w.node(name, "n8n-nodes-base.executeWorkflow", 1.2, {
        "workflowId": {"__rl": True, "value": wid, "mode": "id"},
        "options": {"waitForSubWorkflow": True},
    }, pos, **extra)


def setjson(w, name, code, pos, **extra):
    """A Set node whose output is the JSON object the expression builds."""
    return w.node(name, "n8n-nodes-base.set", 3.4, {
        "mode": "raw", "jsonOutput": expr("JSON.stringify(" + code + ")"), "options": {},
    }, pos, **extra)


def cond(left, op, right=None, type_="string"):
    c = {"id": str(uuid.uuid5(NS, left + op + str(right))), "leftValue": left,
         "operator": {"type": type_, "operation": op}}
    if right is None:
        c["operator"]["singleValue"] = True
    else:
        c["rightValue"] = right
    return c


def conditions(*cs, combinator="and"):
    return {"options": {"caseSensitive": True, "leftValue": "", "typeValidation": "loose", "version": 2},
            "conditions": list(cs), "combinator": combinator}


def if_(w, name, expr_true, pos, **extra):
    """An If node on one boolean expression: output 0 true, 1 false."""
    return w.node(name, "n8n-nodes-base.if", 2.2, {
        "conditions": conditions(cond(expr(expr_true), "true", type_="boolean")),
        "looseTypeValidation": True, "options": {},
    }, pos, **extra)


def switch(w, name, rules, pos, fallback=True):
    """rules: [(output name, boolean expression)], in order; the fallback
    output, when kept, comes last."""
    values = [{"conditions": conditions(cond(expr(e), "true", type_="boolean")),
               "renameOutput": True, "outputKey": k} for k, e in rules]
    opts = {"fallbackOutput": "extra", "renameFallbackOutput": "other"} if fallback else {}
    return w.node(name, "n8n-nodes-base.switch", 3.2, {
        "rules": {"values": values}, "looseTypeValidation": True, "options": opts}, pos)


def stop(w, name, message_expr, pos):
    return w.node(name, "n8n-nodes-base.stopAndError", 1, {"errorMessage": expr(message_expr)}, pos)


def noop(w, name, pos, note_=None):
    extra = {"notes": note_, "notesInFlow": True} if note_ else {}
    return w.node(name, "n8n-nodes-base.noOp", 1, {}, pos, **extra)


def wait(w, name, seconds_expr, pos):
    return w.node(name, "n8n-nodes-base.wait", 1.1, {"amount": expr(seconds_expr), "unit": "seconds"},
                  pos, webhookId=str(uuid.uuid5(NS, w.id + "/wait/" + name)))


def http(w, name, method, url_expr, pos, body_expr=None, timeout=30000):
    """An HTTP Request to the edge: the whole response (status, headers,
    body) as the item, never an error for an HTTP status (the caller routes
    on statusCode), retried only when the edge cannot be reached at all."""
    p = {
        "method": method, "url": expr(url_expr),
        "authentication": "genericCredentialType", "genericAuthType": "httpHeaderAuth",
        "options": {"response": {"response": {"fullResponse": True, "neverError": True}}, "timeout": timeout},
    }
    if body_expr:
        p.update(sendBody=True, specifyBody="json", jsonBody=expr("JSON.stringify(" + body_expr + ")"))
    return w.node(name, "n8n-nodes-base.httpRequest", 4.2, p, pos, credentials=CRED_EDGE,
                  retryOnFail=True, maxTries=3, waitBetweenTries=2000)


def dedupe(w, name, key_expr, pos, always=False):
    """Remove Duplicates across executions, in one store per workflow: an
    item passes only the first time its key is seen."""
    extra = {"alwaysOutputData": True} if always else {}
    return w.node(name, "n8n-nodes-base.removeDuplicates", 2, {
        "operation": "removeItemsSeenInPreviousExecutions",
        "logic": "removeItemsWithAlreadySeenKeyValues",
        "dedupeValue": expr(key_expr),
        "options": {"scope": "workflow", "historySize": 100000},
    }, pos, **extra)


def send_email(w, name, to_expr, subject_expr, text_expr, pos):
    return w.node(name, "n8n-nodes-base.emailSend", 2.1, {
        "fromEmail": "={{ $('Settings').first().json.mail_from }}",
        "toEmail": expr(to_expr),
        "subject": expr(subject_expr),
        "emailFormat": "text",
        "text": expr(text_expr),
        "options": {"appendAttribution": False},
    }, pos, credentials=CRED_SMTP)


# The approved reply goes out with n8nbrain's Send Reply node
# (deploy/n8n/nodes, loaded through N8N_CUSTOM_EXTENSIONS): the Send Email
# node's SMTP credential, nodemailer and output, plus In-Reply-To, References
# and a Message-ID of ours, which the Send Email node cannot set.
SEND_REPLY = "CUSTOM.n8nbrainSendReply"
# The Message-ID of the reply an approval sends: the Sent folder's trigger
# tells the assistant's own replies (a copy, evidence for verify_reply_sent)
# from a person's by it, since both answer the customer's message.
OWN_REPLY = "/^<n8nbrain-reply\\./"


def own_reply_id(approval_js):
    """JavaScript: the Message-ID of the reply that approval sends,
    <n8nbrain-reply.<approval id>@<mail_from's domain>>."""
    return ("'<n8nbrain-reply.' + " + approval_js + " + '@' + ((" + ADDRESS + ")($('Settings').first().json.mail_from)"
            ".split('@')[1] || 'localhost') + '>'")


# JavaScript: a message id as the Send Reply node takes it (<left@right>;
# brackets added when missing), or '' when it is none (a webhook source's
# own id): then the reply is sent unthreaded.
MSG_ID = ("(s) => { s = String(s || '').trim(); if (s !== '' && s[0] !== '<') s = '<' + s + '>'; "
          "return /^<[^<>\\s@]+@[^<>\\s@]+>$/.test(s) ? s : ''; }")


def send_reply(w, name, src, pos):
    """The approved reply, threaded: src is the node whose first item holds
    to, subject, body, in_reply_to, thread_root and message_id."""
    j = "$('" + src + "').first().json."
    return w.node(name, SEND_REPLY, 1, {
        "fromEmail": "={{ $('Settings').first().json.mail_from }}",
        "toEmail": expr(j + "to"),
        "subject": expr(j + "subject"),
        "text": expr(j + "body"),
        "inReplyTo": expr(j + "in_reply_to"),
        "references": expr("[...new Set([" + j + "thread_root, " + j + "in_reply_to].filter(i => i))].join(' ')"),
        "messageId": expr(j + "message_id"),
    }, pos, credentials=CRED_SMTP)


# Every notification's subject starts with this tag. n8n's Send Email node
# can set no header of its own (no X-…, no Auto-Submitted, and the
# Message-ID nodemailer writes looks like any mail client's), so the tag
# and the sender are how the IMAP intake recognises the assistant's own
# notifications, and replies to them, when they land in its INBOX.
TAG = "[n8nbrain]"
# JavaScript: does a subject carry the tag, after any reply or forward prefixes?
TAGGED = "(s) => /^\\s*((re|fwd?|aw|wg|sv|tr|antw)\\s*:\\s*)*\\[n8nbrain\\]/i.test(String(s || ''))"


def notify_email(w, name, subject_expr, text_expr, pos):
    """A notification to a person (settings' notify_to), its subject tagged."""
    return send_email(w, name, "$('Settings').first().json.notify_to", "'" + TAG + " ' + " + subject_expr, text_expr, pos)


def loop(w, name, pos):
    """Loop Over Items, one at a time: output 0 done, 1 the next item. A
    trigger hands over every new message of a poll in one run, and the
    sub-workflows act on their first input item only."""
    return w.node(name, "n8n-nodes-base.splitInBatches", 3, {"batchSize": 1, "options": {}}, pos)


# n8n Data tables (a core feature of n8n 2.x, in n8n's own database): what
# the workflows must look up later by a field's value, not only by an exact
# key as Remove Duplicates does. Each is created on first use.
REPLIES = ("n8nbrain_thread_replies", [("thread_id", "string"), ("message_id", "string"),
                                       ("replied_at", "date"), ("text", "string")])
REPLIES_KEPT_DAYS = 90
NOTIFIED = ("n8nbrain_notified_events", [("event_id", "string"), ("kind", "string")])


def table(w, name, spec, pos):
    """The data table of spec, created when missing. Two first uses at once
    may race to create it: the loser's retry finds the winner's table."""
    tname, cols = spec
    return w.node(name, "n8n-nodes-base.dataTable", 1.1, {
        "resource": "table", "operation": "create", "tableName": tname,
        "columns": {"column": [{"name": c, "type": t} for c, t in cols]},
        "options": {"createIfNotExists": True},
    }, pos, retryOnFail=True, maxTries=3, waitBetweenTries=1000, executeOnce=True)


def table_ref(table_node):
    return {"__rl": True, "mode": "id", "value": "={{ $('" + table_node + "').first().json.id }}"}


def table_insert(w, name, table_node, spec, values, pos):
    """Insert one row per input item; values: column → expression code."""
    _, cols = spec
    schema = [{"id": c, "displayName": c, "required": False, "defaultMatch": False, "display": True,
               "type": "dateTime" if t == "date" else t, "canBeUsedToMatch": True} for c, t in cols if c in values]
    return w.node(name, "n8n-nodes-base.dataTable", 1.1, {
        "resource": "row", "operation": "insert", "dataTableId": table_ref(table_node),
        "columns": {"mappingMode": "defineBelow", "value": {c: expr(v) for c, v in values.items()},
                    "matchingColumns": [], "schema": schema, "attemptToConvertTypes": False, "convertFieldsToString": False},
        "options": {},
    }, pos)


def table_filter(*conds):
    """conds: (column, condition, value expression code)."""
    return {"conditions": [{"keyName": c, "condition": op, "keyValue": expr(v)} for c, op, v in conds]}


def table_get(w, name, table_node, conds, pos):
    """The first row matching every condition, or one empty item."""
    return w.node(name, "n8n-nodes-base.dataTable", 1.1, {
        "resource": "row", "operation": "get", "dataTableId": table_ref(table_node),
        "matchType": "allConditions", "filters": table_filter(*conds), "limit": 1,
    }, pos, alwaysOutputData=True, executeOnce=True)


def table_delete(w, name, table_node, conds, pos):
    """Delete every row matching every condition (once per run)."""
    return w.node(name, "n8n-nodes-base.dataTable", 1.1, {
        "resource": "row", "operation": "deleteRows", "dataTableId": table_ref(table_node),
        "matchType": "allConditions", "filters": table_filter(*conds), "options": {},
    }, pos, alwaysOutputData=True, executeOnce=True)


# ---------------------------------------------------------------------------
# n8nbrain: submit turn. Input {request}; output {ok, decision} or
# {ok: false, status, retryable, error}. Never fails on an HTTP status.

def turn_workflow():
    w = Workflow(TURN, "n8nbrain: submit turn")
    note(w, "Read me", "## Submit a turn\nCalled with `{request}` (a `POST /v1/turns` body). Answers `{ok: true, decision}` or "
         "`{ok: false, status, retryable, error}`.\n\n* **202** (still deciding): waits `Retry-After` and fetches `result_url` "
         "(404 = not yet) up to 60 times.\n* **429, 5xx**: up to 5 attempts with the edge's `Retry-After` (or a growing pause); "
         "re-submitting a turn is always safe.\n* **Other 4xx** are answered at once, never retried: the same request "
         "would get the same answer.\n* The edge unreachable: three tries, then this run fails.\n\nThe edge's address is "
         "the *n8nbrain: settings* workflow's `edge_url`, written by the import.", (-300, -460), h=380)
    called(w, (-300, 0))
    call(w, "Settings", SETTINGS, (-80, 0))
    setjson(w, "First attempt", "{request: $('Called').first().json.request, edge_url: $json.edge_url, attempt: 1}", (140, 0))
    setjson(w, "Attempt", "{request: $json.request, edge_url: $json.edge_url, attempt: $json.attempt}", (260, 120))
    http(w, "POST /v1/turns", "POST", "$json.edge_url + '/v1/turns'", (380, 0), body_expr="$json.request")
    switch(w, "Answer", [
        ("decision", "$json.statusCode === 200"),
        ("pending", "$json.statusCode === 202"),
        ("transient", "[429, 500, 502, 503, 504].includes($json.statusCode)"),
    ], (620, 0))
    setjson(w, "Decision", "{ok: true, decision: $json.body}", (900, -200))
    # Pending: poll result_url.
    setjson(w, "Pending", "{edge_url: $('Attempt').last().json.edge_url, result_url: $json.body.result_url, "
            "polls: 0, wait: Number(($json.headers || {})['retry-after']) || 1}", (900, 0))
    wait(w, "Wait for the decision", "$json.wait", (1120, 0))
    http(w, "GET result_url", "GET", "$json.edge_url + $json.result_url", (1340, 0))
    switch(w, "Decided?", [
        ("decided", "$json.statusCode === 200"),
        ("not yet", "$json.statusCode === 404 && $('Wait for the decision').last().json.polls < 60"),
    ], (1560, 0))
    setjson(w, "Decision (fetched)", "{ok: true, decision: $json.body}", (1800, -120))
    setjson(w, "Poll again", "{edge_url: $('Wait for the decision').last().json.edge_url, result_url: $('Wait for the decision').last().json.result_url, "
            "polls: $('Wait for the decision').last().json.polls + 1, wait: 1}", (1800, 40))
    setjson(w, "No decision", "{ok: false, status: $json.statusCode, retryable: true, error: ($json.body && $json.body.error) || "
            "{code: 'unavailable', message: 'no decision at result_url after ' + ($('Wait for the decision').last().json.polls + 1) + ' polls'}}", (1800, 200))
    # Transient: back off and retry, bounded.
    if_(w, "Try again?", "$('Attempt').last().json.attempt < 5", (900, 220))
    setjson(w, "Back off", "{request: $('Attempt').last().json.request, edge_url: $('Attempt').last().json.edge_url, "
            "attempt: $('Attempt').last().json.attempt + 1, "
            "wait: Number(($json.headers || {})['retry-after']) || 2 * $('Attempt').last().json.attempt}", (1120, 200))
    wait(w, "Pause", "Math.min($json.wait, 30)", (1340, 200))
    setjson(w, "Unavailable", "{ok: false, status: $json.statusCode, retryable: true, error: ($json.body && $json.body.error) || {code: 'unavailable', message: 'the edge answered ' + $json.statusCode}}", (1120, 420))
    setjson(w, "Refused", "{ok: false, status: $json.statusCode, retryable: [401, 403].includes($json.statusCode), "
            "error: ($json.body && $json.body.error) || {code: 'invalid', message: 'the edge answered ' + $json.statusCode}}", (900, 420))
    w.chain("Called", "Settings", "First attempt", "Attempt", "POST /v1/turns", "Answer")
    w.connect("Answer", "Decision", 0)
    w.connect("Answer", "Pending", 1)
    w.connect("Answer", "Try again?", 2)
    w.connect("Answer", "Refused", 3)
    w.chain("Pending", "Wait for the decision", "GET result_url", "Decided?")
    w.connect("Decided?", "Decision (fetched)", 0)
    w.connect("Decided?", "Poll again", 1)
    w.connect("Decided?", "No decision", 2)
    w.connect("Poll again", "Wait for the decision")
    w.connect("Try again?", "Back off", 0)
    w.connect("Try again?", "Unavailable", 1)
    w.chain("Back off", "Pause", "Attempt")
    return w


# ---------------------------------------------------------------------------
# n8nbrain: act. Input {op, ...}: every effect on the outside world, and the
# one store (Remove Duplicates, scope workflow) that makes them happen once.

CANON = ("(function canon(v) { if (Array.isArray(v)) return '[' + v.map(canon).join(',') + ']'; "
         "if (v !== null && typeof v === 'object') return '{' + Object.keys(v).sort().map(k => JSON.stringify(k) + ':' + canon(v[k])).join(',') + '}'; "
         "return JSON.stringify(v).replace(/</g, '\\\\u003c').replace(/>/g, '\\\\u003e').replace(/&/g, '\\\\u0026')"
         ".replace(/\\u2028/g, '\\\\u2028').replace(/\\u2029/g, '\\\\u2029'); })")

ADDRESS = "(a) => ((String(a || '').match(/<([^>]+)>/) || [null, String(a || '')])[1]).trim().toLowerCase()"


def act_workflow():
    w = Workflow(ACT, "n8nbrain: act")
    note(w, "Read me", "## Acting on the brain's decisions\nCalled with `{op, …}` by the other n8nbrain workflows.\n\n"
         "* `decision`: route the decision; `send_reply` checks the approved content's SHA-256 against `content_sha256`, "
         "checks that no person replied in the thread since `abort_if_replied_since` (else `closed_manual`), sends **exactly "
         "the approved text** over SMTP with n8nbrain's Send Reply node (threaded: `In-Reply-To`, `References`), and reports the real outcome: "
         "`succeeded` when the SMTP server accepted it, `failed` when it refused it (a 4xx/5xx answer), `unknown` when no "
         "answer came (then the brain's `verify_reply_sent` reads back).\n"
         "* `event`: submit the turn an `approval_decided`/`approval_expired` event asks for; notify reviewers on "
         "`approval_requested`, a person on `item_halted` (once per event id).\n* `human_reply`: a person answered in a "
         "thread: recorded, and `closed_manual`.\n"
         "* `sent_copy`: a copy of a sent message seen in the Sent folder (evidence for `verify_reply_sent`).\n\n"
         "**Once only**: the Remove Duplicates store (scope: this workflow) holds `send:<approval>` (a duplicated event "
         "sends nothing) and `copy:<Message-ID>` (the assistant's replies seen in Sent). Data tables: `" + REPLIES[0] + "` (a person's replies, by "
         "every message id they answer, with the time) and `" + NOTIFIED[0] + "` (events a person was told about).", (-400, -600), w_=620, h=560)
    called(w, (-400, 0))
    call(w, "Settings", SETTINGS, (-180, 0))
    switch(w, "Op", [
        ("decision", "$('Called').first().json.op === 'decision'"),
        ("event", "$('Called').first().json.op === 'event'"),
        ("human reply", "$('Called').first().json.op === 'human_reply'"),
        ("sent copy", "$('Called').first().json.op === 'sent_copy'"),
    ], (40, 0))
    stop(w, "Unknown op", "'n8nbrain: act called with unknown op ' + $('Called').first().json.op", (300, 520))
    w.chain("Called", "Settings", "Op")
    w.connect("Op", "Unknown op", 4)

    # --- decision --------------------------------------------------------
    setjson(w, "Decision", "{decision: $('Called').first().json.decision}", (300, -300))
    route_decision(w, (520, -300))
    w.connect("Op", "Decision", 0)
    w.connect("Decision", "Route decision")

    # --- event -----------------------------------------------------------
    switch(w, "Event kind", [
        ("next turn", "['approval_decided', 'approval_expired'].includes($('Called').first().json.event.kind)"),
        ("approval requested", "$('Called').first().json.event.kind === 'approval_requested'"),
        ("item halted", "$('Called').first().json.event.kind === 'item_halted'"),
    ], (300, 700))
    setjson(w, "Next turn", "{request: {work_item_id: $('Called').first().json.event.work_item_id, turn: $('Called').first().json.event.next_turn}}", (560, 560))
    call(w, "Submit the event's turn", TURN, (780, 560))
    # 400/404/409/422: the same turn again gets the same answer, so the event
    # is acknowledged (redelivery cannot help) and the run fails with the
    # edge's message. 401/403/429/5xx: not acknowledged, the edge delivers again.
    setjson(w, "Event answer", "{ack: $json.ok || !$json.retryable, decision: $json.ok ? $json.decision : null, "
            "failure: $json.ok ? null : ('the edge refused turn ' + $('Next turn').first().json.request.turn + ' (' + $json.status + ' ' + "
            "($json.error.reason || $json.error.code) + '): ' + $json.error.message)}", (1000, 560))
    # approval_requested and item_halted tell a person, once per event: the
    # event id is recorded after the e-mail went out, so a delivery whose
    # e-mail failed is notified again when the edge delivers it again.
    table(w, "Notified events", NOTIFIED, (560, 760))
    table_get(w, "Notice sent before", "Notified events", [("event_id", "eq", "$('Called').first().json.event.event_id")], (700, 760))
    if_(w, "Not notified yet?", "$json.event_id === undefined", (840, 760))
    switch(w, "Notify whom", [
        ("reviewers", "$('Called').first().json.event.kind === 'approval_requested'"),
        ("a person", "$('Called').first().json.event.kind === 'item_halted'"),
    ], (980, 760), fallback=False)
    http(w, "Requested approval", "GET", "$('Settings').first().json.edge_url + '/v1/approvals/' + encodeURIComponent($('Called').first().json.event.approval_id)", (1000, 700))
    if_(w, "Approval found?", "$json.statusCode === 200", (1160, 700))
    notify_email(w, "Notify reviewers",
                 "'Approval needed: ' + (($json.body.email || {}).subject || $json.body.approval.action)",
                 "'A ' + $json.body.approval.action + ' waits for your approval (it expires ' + $json.body.approval.expires_at + ').\\n\\n'"
                 " + 'From: ' + (($json.body.email || {}).from || '') + '\\nSubject: ' + (($json.body.email || {}).subject || '') + '\\n\\n'"
                 " + 'Review it: ' + $('Settings').first().json.review_url + '/review/approvals/' + $json.body.approval.id + '\\n'", (1360, 640))
    stop(w, "Approval not readable", "'approval ' + $('Called').first().json.event.approval_id + ': the edge answered ' + $json.statusCode + ' ' + JSON.stringify($json.body)", (1360, 800))
    notify_email(w, "Notify: halted",
                 "'Work item halted: ' + ($('Called').first().json.event.reason || 'needs a person')",
                 "'The brain halted a work item and flagged it for a person.\\n\\nWork item: ' + $('Called').first().json.event.work_item_id"
                 " + '\\nReason: ' + ($('Called').first().json.event.reason || '') + '\\n\\nNothing more happens for it until a person acts.\\n'", (1000, 900))
    table_insert(w, "Record the notice", "Notified events", NOTIFIED,
                 {"event_id": "$('Called').first().json.event.event_id", "kind": "$('Called').first().json.event.kind"}, (1560, 760))
    setjson(w, "Acknowledge", "{ack: true, decision: null, failure: null}", (1760, 860), executeOnce=True)
    noop(w, "Notified before", (1000, 1060), "A second delivery of this event: the e-mail went out on the first.")
    w.connect("Op", "Event kind", 1)
    w.connect("Event kind", "Next turn", 0)
    w.connect("Event kind", "Notified events", 1)
    w.connect("Event kind", "Notified events", 2)
    w.connect("Event kind", "Acknowledge", 3)
    w.chain("Next turn", "Submit the event's turn", "Event answer")
    w.chain("Notified events", "Notice sent before", "Not notified yet?")
    w.connect("Not notified yet?", "Notify whom", 0)
    w.connect("Not notified yet?", "Notified before", 1)
    w.connect("Notified before", "Acknowledge")
    w.connect("Notify whom", "Requested approval", 0)
    w.connect("Notify whom", "Notify: halted", 1)
    w.chain("Requested approval", "Approval found?")
    w.connect("Approval found?", "Notify reviewers", 0)
    w.connect("Approval found?", "Approval not readable", 1)
    w.connect("Notify reviewers", "Record the notice")
    w.connect("Notify: halted", "Record the notice")
    w.connect("Record the notice", "Acknowledge")

    # --- human reply -----------------------------------------------------
    # A person answered in a thread (the Sent folder, or the human-reply
    # webhook): recorded under every message id the reply names (In-Reply-To
    # and References), with its time, for the check right before a send;
    # and the message it answers is reported closed_manual on turn 2 while
    # its draft still waits (later turns are the send path's to report).
    table(w, "Replies table", REPLIES, (160, 1200))
    setjson(w, "Thread ids", "{thread_ids: [...new Set([$('Called').first().json.work_item_id].concat($('Called').first().json.thread_ids || [])"
            ".map(i => String(i || '').trim()).filter(i => i))]}", (300, 1200), executeOnce=True)
    w.node("One row per id", "n8n-nodes-base.splitOut", 1, {"fieldToSplitOut": "thread_ids", "include": "noOtherFields", "options": {}}, (440, 1200))
    table_insert(w, "Record the reply", "Replies table", REPLIES, {
        "thread_id": "$json.thread_ids", "message_id": "String($('Called').first().json.message_id || '')",
        "replied_at": "$('Called').first().json.human_action.at || $now.toISO()",
        "text": "String($('Called').first().json.human_action.text || '').slice(0, 2000)"}, (580, 1200))
    # The check before a send looks back to when the draft was proposed, and
    # a draft waits days, not months: rows older than REPLIES_KEPT_DAYS are
    # dropped as each reply is recorded, so the table (n8n caps the size of
    # its data tables) stays small.
    table_delete(w, "Forget old replies", "Replies table", [
        ("replied_at", "lt", "$now.minus({days: " + str(REPLIES_KEPT_DAYS) + "}).toISO()")], (650, 1300))
    if_(w, "Answers a message?", "!!$('Called').first().json.work_item_id", (720, 1200), executeOnce=True)
    setjson(w, "Closed by a human", "{request: {work_item_id: $('Called').first().json.work_item_id, turn: 2, latest_result: "
            "{action: 'draft_reply', outcome: 'closed_manual', human_action: $('Called').first().json.human_action}}}", (900, 1120))
    call(w, "Report closed_manual", TURN, (1100, 1120))
    # 409: turn 2 was taken (the approval's event came first: the send path
    # finds the reply right before sending and reports closed_manual
    # itself), or the message is no work item; 422: closed.
    if_(w, "Reported?", "$json.ok || [409, 422].includes($json.status)", (1300, 1120))
    noop(w, "Closed manually", (1500, 1060))
    stop(w, "closed_manual refused", "'closed_manual for ' + $('Called').first().json.work_item_id + ' refused (' + $json.status + '): ' + $json.error.message", (1500, 1200))
    noop(w, "Recorded", (900, 1300), "The reply names no message it answers: recorded for the check before sending only.")
    w.connect("Op", "Replies table", 2)
    w.chain("Replies table", "Thread ids", "One row per id", "Record the reply", "Forget old replies", "Answers a message?")
    w.connect("Answers a message?", "Closed by a human", 0)
    w.connect("Answers a message?", "Recorded", 1)
    w.chain("Closed by a human", "Report closed_manual", "Reported?")
    w.connect("Reported?", "Closed manually", 0)
    w.connect("Reported?", "closed_manual refused", 1)

    # --- sent copy -------------------------------------------------------
    # The assistant's own reply, by its Message-ID: the evidence
    # verify_reply_sent looks for.
    dedupe(w, "Record the copy", "'copy:' + $('Called').first().json.message_id", (300, 1480))
    w.connect("Op", "Record the copy", 3)
    return w


def route_decision(w, pos):
    x, y = pos
    switch(w, "Route decision", [
        ("send_reply", "(($json.decision.action || {}).name) === 'send_reply'"),
        ("verify_reply_sent", "(($json.decision.action || {}).name) === 'verify_reply_sent'"),
        ("escalate_item", "(($json.decision.action || {}).name) === 'escalate_item'"),
        ("create_job", "(($json.decision.action || {}).name) === 'create_job'"),
    ], (x, y))
    noop(w, "Nothing to do", (x + 260, y + 560), "Awaiting approval (the approval_requested event notifies reviewers), closed, or waits for a person.")
    w.connect("Route decision", "Nothing to do", 4)

    # send_reply: read the approval, check the hash, check that no person
    # replied in the thread since the draft was proposed
    # (abort_if_replied_since), once per approval, send, report.
    setjson(w, "To send", "{decision: $json.decision}", (x + 140, y - 700))
    http(w, "Approved content", "GET", "$('Settings').first().json.edge_url + '/v1/approvals/' + encodeURIComponent($json.decision.action.params.approval_id)", (x + 260, y - 700))
    setjson(w, "Check the approved text", "(() => { const d = $('To send').last().json.decision; const a = $json.body.approval || {}; "
            "const content = a.edited || a.proposed || {}; const p = d.action.params; "
            "return {decision: d, status: $json.statusCode, approval_id: p.approval_id, work_item_id: d.work_item_id, since: p.abort_if_replied_since, "
            "hash_ok: $json.statusCode === 200 && a.status === 'approved' && " + CANON + "(content).hash('sha256') === p.content_sha256 && a.approved_sha256 === p.content_sha256, "
            "to: ($json.body.email || {}).from || '', subject: content.subject, body: content.body, "
            # Threading: In-Reply-To names the customer's message; References
            # the thread's first message (turn 1's thread_id) and that one.
            "in_reply_to: (" + MSG_ID + ")(($json.body.email || {}).message_id || d.work_item_id), "
            "thread_root: (" + MSG_ID + ")(($json.body.email || {}).thread_id), "
            "message_id: " + own_reply_id("p.approval_id") + "}; })()", (x + 480, y - 700))
    if_(w, "Exactly the approved text?", "$json.hash_ok && $json.to !== ''", (x + 700, y - 700))
    # The check right before sending: a reply a person sent in this thread
    # (its In-Reply-To or References name this message) since the draft was
    # proposed, as the Sent folder's trigger recorded it.
    table(w, "Thread replies", REPLIES, (x + 860, y - 760))
    table_get(w, "Replied since?", "Thread replies", [
        ("thread_id", "eq", "$('Check the approved text').first().json.work_item_id"),
        ("replied_at", "gte", "$('Check the approved text').first().json.since")], (x + 1000, y - 760))
    if_(w, "No human reply yet?", "$json.thread_id === undefined", (x + 1140, y - 760))
    setjson(w, "To send once", "{approval_id: $('Check the approved text').first().json.approval_id}", (x + 1280, y - 820))
    dedupe(w, "Once per approval", "'send:' + $json.approval_id", (x + 1400, y - 820), always=True)
    if_(w, "First send?", "$json.approval_id !== undefined", (x + 1520, y - 820))
    send_reply(w, "Send the approved reply", "Check the approved text", (x + 1660, y - 880))
    w.nodes[-1]["onError"] = "continueErrorOutput"
    setjson(w, "Sent", "{request: {work_item_id: $('Check the approved text').last().json.work_item_id, turn: $('Check the approved text').last().json.decision.next_turn, "
            "latest_result: {action: 'send_reply', outcome: 'succeeded', detail: String($json.response || '').slice(0, 200)}}}", (x + 1880, y - 960))
    # nodemailer's error says what the SMTP server answered: a 4xx or 5xx
    # reply to MAIL, RCPT, DATA, the message or the login is a refusal, so
    # the message was not accepted: failed. Anything else (no connection,
    # the connection lost, a timeout, above all after the message was sent)
    # may have been accepted: unknown, and never resent; the brain asks for
    # verify_reply_sent to read back.
    # The Send Reply node's own refusals, before any SMTP exchange, start
    # "not sent: " (a message id that is none, nodemailer not found).
    if_(w, "Refused by the server?", "/^not sent: /.test(String($json.error || '')) || /^(Mail command failed|Can.t send mail - all recipients were rejected|Data command failed|Message failed|Invalid login): [45][0-9][0-9]/.test(String($json.error || ''))", (x + 1880, y - 800))
    setjson(w, "Refused", "{request: {work_item_id: $('Check the approved text').last().json.work_item_id, turn: $('Check the approved text').last().json.decision.next_turn, "
            "latest_result: {action: 'send_reply', outcome: 'failed', detail: ((e) => /^not sent: /.test(e) ? e : 'the SMTP server refused it: ' + e)(String($('Send the approved reply').last().json.error)).slice(0, 200)}}}", (x + 2080, y - 860))
    setjson(w, "Not confirmed", "{request: {work_item_id: $('Check the approved text').last().json.work_item_id, turn: $('Check the approved text').last().json.decision.next_turn, "
            "latest_result: {action: 'send_reply', outcome: 'unknown', detail: String($('Send the approved reply').last().json.error || 'no answer from the SMTP server').slice(0, 200)}}}", (x + 2080, y - 740))
    setjson(w, "A human replied first", "{request: {work_item_id: $('Check the approved text').last().json.work_item_id, turn: $('Check the approved text').last().json.decision.next_turn, "
            "latest_result: {action: 'send_reply', outcome: 'closed_manual', human_action: {kind: 'replied', "
            "text: $json.text || 'a person replied in the thread before the approved reply was sent', at: $json.replied_at}}}}", (x + 1280, y - 640))
    setjson(w, "Not the approved text", "{request: {work_item_id: $json.work_item_id, turn: $json.decision.next_turn, "
            "latest_result: {action: 'send_reply', outcome: 'failed', detail: $json.status !== 200 ? 'the approval could not be read (' + $json.status + ')' : 'the approved content does not match content_sha256; nothing was sent'}}}", (x + 860, y - 560))
    noop(w, "Already sent", (x + 1660, y - 720), "A second delivery of the same approval: sent once already, and reported by that run.")
    w.connect("Route decision", "To send", 0)
    w.connect("To send", "Approved content")
    w.chain("Approved content", "Check the approved text", "Exactly the approved text?")
    w.connect("Exactly the approved text?", "Thread replies", 0)
    w.connect("Exactly the approved text?", "Not the approved text", 1)
    w.chain("Thread replies", "Replied since?", "No human reply yet?")
    w.connect("No human reply yet?", "To send once", 0)
    w.connect("No human reply yet?", "A human replied first", 1)
    w.chain("To send once", "Once per approval", "First send?")
    w.connect("First send?", "Send the approved reply", 0)
    w.connect("First send?", "Already sent", 1)
    w.connect("Send the approved reply", "Sent", 0)
    w.connect("Send the approved reply", "Refused by the server?", 1)
    w.connect("Refused by the server?", "Refused", 0)
    w.connect("Refused by the server?", "Not confirmed", 1)

    # verify_reply_sent: wait for the Sent folder's copy, then look it up by
    # the Message-ID the approval's reply was sent with. Nothing else can
    # match: not an identical reply to the same person (a rule's text sent
    # twice), which a match on recipient and text would take for this one.
    setjson(w, "Copy key", "{decision: $json.decision, key: 'copy:' + " + own_reply_id("$json.decision.action.params.approval_id") + ", "
            "wait: Number($('Settings').first().json.verify_wait_seconds) || 60}", (x + 140, y - 200))
    wait(w, "Wait for the copy", "$json.wait", (x + 360, y - 200))
    dedupe(w, "Copy not seen?", "$json.key", (x + 580, y - 200), always=True)
    # The key passes only if it was never recorded: no item with it means
    # the copy was seen.
    setjson(w, "Verified", "(() => { const seen = $input.all().every(i => i.json.key === undefined); "
            "return {request: {work_item_id: $('Copy key').last().json.decision.work_item_id, turn: $('Copy key').last().json.decision.next_turn, "
            "latest_result: {action: 'verify_reply_sent', outcome: seen ? 'succeeded' : 'failed', "
            "detail: seen ? 'a copy is in the Sent folder' : 'no copy in the Sent folder after ' + $('Copy key').last().json.wait + ' s'}}}; })()", (x + 800, y - 200), executeOnce=True)
    w.connect("Route decision", "Copy key", 1)
    w.chain("Copy key", "Wait for the copy", "Copy not seen?", "Verified")

    # escalate_item: tell a person.
    notify_email(w, "Notify: a person decides",
                 "'Needs a person: ' + ((($json.decision.action || {}).params || {}).reason || $json.decision.status)",
                 "'The brain handed a work item to a person.\\n\\nWork item: ' + $json.decision.work_item_id + '\\nReason: ' + "
                 "((($json.decision.action || {}).params || {}).reason || '') + '\\nCategory: ' + (($json.decision.assessment || {}).category || '') + '\\n'", (x + 260, y + 120))
    # create_job: no job system is connected: a person creates it; reported
    # failed, so the brain escalates and the item shows as failed.
    setjson(w, "Job", "{decision: $json.decision}", (x + 140, y + 320))
    notify_email(w, "Notify: create the job by hand",
                 "'Create a job by hand: ' + $('Job').last().json.decision.work_item_id",
                 "'The brain approved a job, and no job system is connected to n8n.\\n\\nJob: ' + JSON.stringify($('Job').last().json.decision.action.params) + '\\n'", (x + 260, y + 320))
    setjson(w, "No job system", "{request: {work_item_id: $('Job').last().json.decision.work_item_id, turn: $('Job').last().json.decision.next_turn, "
            "latest_result: {action: 'create_job', outcome: 'failed', detail: 'no job system is connected; a person was asked to create it'}}}", (x + 480, y + 320))
    w.connect("Route decision", "Notify: a person decides", 2)
    w.connect("Route decision", "Job", 3)
    w.connect("Job", "Notify: create the job by hand")
    w.connect("Notify: create the job by hand", "No job system")

    # Report an outcome, then act on the next decision.
    call(w, "Report the outcome", TURN, (x + 2040, y - 300))
    if_(w, "Outcome accepted?", "$json.ok", (x + 2260, y - 300))
    setjson(w, "Next decision", "{decision: $json.decision}", (x + 2480, y - 360))
    stop(w, "Outcome refused", "'the edge refused the outcome (' + $json.status + ' ' + ($json.error.reason || $json.error.code) + '): ' + $json.error.message", (x + 2480, y - 200))
    for src in ("Sent", "Refused", "Not confirmed", "A human replied first", "Not the approved text", "Verified", "No job system"):
        w.connect(src, "Report the outcome")
    w.chain("Report the outcome", "Outcome accepted?")
    w.connect("Outcome accepted?", "Next decision", 0)
    w.connect("Outcome accepted?", "Outcome refused", 1)
    w.connect("Next decision", "Route decision")
    return w


# ---------------------------------------------------------------------------
# n8nbrain: brain events. The edge's webhook; keeps no run data (the headers
# hold the secret).

def events_workflow():
    w = Workflow(EVENTS, "n8nbrain: brain events", save_data=False)
    note(w, "Read me", "## Events from the brain\nThe edge POSTs every event here (`EDGE_WEBHOOK_URL=<n8n>/webhook/brain-events`) "
         "with `X-Brain-Webhook-Token` (credential *n8nbrain events*) and `Idempotency-Key: <event id>`.\n\n"
         "The answer is given **after** the event's turn was accepted (`200`), or an error (`503`): the edge delivers "
         "again until n8n accepts, so a failed run gets its event again. A turn the edge refuses for good (400, 409, 422) "
         "is acknowledged and this run fails with the edge's message.\n\nThis workflow keeps no run data (the request "
         "headers hold the secret); *n8nbrain: act* does the work and keeps its runs.", (-300, -440), h=380)
    w.node("Brain event", "n8n-nodes-base.webhook", 2, {
        "httpMethod": "POST", "path": "brain-events", "authentication": "headerAuth",
        "responseMode": "responseNode", "options": {},
    }, (-300, 0), webhookId=str(uuid.uuid5(NS, "webhook/brain-events")), credentials=CRED_EVENTS)
    setjson(w, "Event only", "{op: 'event', event: $json.body}", (-80, 0))
    call(w, "Accept the event", ACT, (140, 0))
    if_(w, "Acknowledge?", "$json.ack === true", (360, 0))
    w.node("200 accepted", "n8n-nodes-base.respondToWebhook", 1.1, {
        "respondWith": "json", "responseBody": "={{ JSON.stringify({accepted: true}) }}", "options": {"responseCode": 200},
    }, (580, -100))
    w.node("503 deliver again", "n8n-nodes-base.respondToWebhook", 1.1, {
        "respondWith": "json", "responseBody": "={{ JSON.stringify({accepted: false, error: $json.failure}) }}", "options": {"responseCode": 503},
    }, (580, 140))
    stop(w, "Not accepted", "$('Accept the event').first().json.failure", (800, 140))
    if_(w, "Refused for good?", "!!$('Accept the event').first().json.failure", (800, -100))
    stop(w, "Refused", "$('Accept the event').first().json.failure", (1020, -180))
    if_(w, "Anything to act on?", "!!$('Accept the event').first().json.decision", (1020, -20))
    setjson(w, "The decision", "{op: 'decision', decision: $('Accept the event').first().json.decision}", (1240, -80))
    call(w, "Act on it", ACT, (1460, -80))
    w.chain("Brain event", "Event only", "Accept the event", "Acknowledge?")
    w.connect("Acknowledge?", "200 accepted", 0)
    w.connect("Acknowledge?", "503 deliver again", 1)
    w.connect("503 deliver again", "Not accepted")
    w.connect("200 accepted", "Refused for good?")
    w.connect("Refused for good?", "Refused", 0)
    w.connect("Refused for good?", "Anything to act on?", 1)
    w.connect("Anything to act on?", "The decision", 0)
    w.connect("The decision", "Act on it")
    return w


def first_turn(w, name, email_expr, pos):
    return setjson(w, name, "(() => { const e = " + email_expr + "; return {request: {work_item_id: e.message_id, turn: 1, email: e}}; })()", pos)


def imap_workflow():
    w = Workflow(IMAP, "n8nbrain: mailbox assistant (IMAP)")
    note(w, "Read me", "## The e-mail assistant (IMAP and SMTP)\n* **New mail** (IMAP, INBOX): turn 1 for each new message; "
         "its Message-ID is the work item. A draft then waits for approval on the review page; reviewers get an e-mail "
         "(the `approval_requested` event). The assistant's own notifications (subject tagged `" + TAG + "`, from `mail_from` "
         "or a `notify_to` address: a notice, or a reviewer's reply to one) are skipped, never work.\n* **Sent mail** (IMAP, "
         "the Sent folder): a message that answers a thread (`In-Reply-To` or `References`) is a human reply: recorded for the "
         "check right before a send, and the message it answers closes as `closed_manual` while its draft waits. The "
         "assistant's own reply (Message-ID `<n8nbrain-reply.…>`) is a sent copy: the evidence `verify_reply_sent` looks for.\n\nCredentials *n8nbrain mailbox (IMAP)* and "
         "*(SMTP)*, *n8nbrain edge*; addresses in *n8nbrain: settings*. All written by the import.", (-300, -500), h=440)
    w.node("New mail", "n8n-nodes-base.emailReadImap", 2.2, {
        "mailbox": "INBOX", "postProcessAction": "read", "format": "resolved",
        "options": {"customEmailConfig": "[\"ALL\"]", "trackLastMessageId": True},
    }, (-300, 0), credentials=CRED_IMAP)
    loop(w, "Each new message", (-100, 0))
    call(w, "Settings", SETTINGS, (100, 60))
    if_(w, "Our own notice?", "(() => { const m = $('Each new message').first().json; "
        "const own = [$json.mail_from].concat(String($json.notify_to || '').split(',')).map(" + ADDRESS + ").filter(a => a); "
        "const from = ((m.from || {}).value || []).map(v => String(v.address || '').toLowerCase()); "
        "return (" + TAGGED + ")(m.subject) && from.some(a => own.includes(a)); })()", (300, 60))
    noop(w, "Not work", (500, -60), "The assistant's own notification, or a reviewer's reply to one.")
    # Mail no person wrote (RFC 3834 Auto-Submitted, the older auto-reply
    # marks, delivery reports and bounces) is never work: a draft answering
    # an out-of-office or a bounce helps nobody. Mailing-list marks
    # (Precedence: list or bulk) are not in it: a shared address such as a
    # Google Group adds them to customers' mail.
    if_(w, "Automatic mail?", "(() => { const m = $('Each new message').first().json; const h = m.headers || {}; "
        "const v = (k) => String(h[k] || '').replace(/^[^:]*:\\s*/, '').trim().toLowerCase(); "
        "const from = ((m.from || {}).value || []).map(a => String(a.address || '').toLowerCase()); "
        "return (v('auto-submitted') !== '' && !/^no\\b/.test(v('auto-submitted'))) || h['x-autoreply'] !== undefined || "
        "h['x-autorespond'] !== undefined || v('precedence') === 'auto_reply' || /^multipart\\/report\\b/.test(v('content-type')) || "
        "v('return-path') === '<>' || from.some(a => /^(mailer-daemon|postmaster)@/.test(a)); })()", (500, 60))
    noop(w, "Automatic", (700, 0), "An auto-reply, a delivery report or a bounce: no person wrote it.")
    # thread_id: the thread's first message (References' first id, else
    # In-Reply-To), for the reply's References.
    first_turn(w, "Turn 1", "(() => { const m = $('Each new message').first().json; return {message_id: m.messageId, "
               "thread_id: [].concat(m.references || [])[0] || m.inReplyTo || undefined, from: (m.from || {}).text || '', "
               "to: ((m.to || {}).value || []).map(a => a.address).filter(a => a), subject: m.subject || '', "
               "body: (m.text || '').slice(0, 100000)}; })()", (700, 120))
    call(w, "Submit turn 1", TURN, (900, 120))
    if_(w, "Decided?", "$json.ok", (1100, 120))
    setjson(w, "The decision", "{op: 'decision', decision: $json.decision}", (1300, 60))
    call(w, "Act on it", ACT, (1500, 60), alwaysOutputData=True)
    stop(w, "Turn 1 refused", "'turn 1 not decided (' + $json.status + ' ' + ($json.error.reason || $json.error.code) + '): ' + $json.error.message", (1300, 240))
    w.chain("New mail", "Each new message")
    w.connect("Each new message", "Settings", 1)
    w.chain("Settings", "Our own notice?")
    w.connect("Our own notice?", "Not work", 0)
    w.connect("Our own notice?", "Automatic mail?", 1)
    w.connect("Automatic mail?", "Automatic", 0)
    w.connect("Automatic mail?", "Turn 1", 1)
    w.connect("Not work", "Each new message")
    w.connect("Automatic", "Each new message")
    w.chain("Turn 1", "Submit turn 1", "Decided?")
    w.connect("Decided?", "The decision", 0)
    w.connect("Decided?", "Turn 1 refused", 1)
    w.chain("The decision", "Act on it", "Each new message")

    w.node("Sent mail", "n8n-nodes-base.emailReadImap", 2.2, {
        "mailbox": "Sent", "postProcessAction": "nothing", "format": "resolved",
        "options": {"customEmailConfig": "[\"ALL\"]", "trackLastMessageId": True},
    }, (-300, 500), credentials=CRED_IMAP)
    loop(w, "Each sent message", (-100, 500))
    # The assistant's own reply (its Message-ID, OWN_REPLY) is a sent copy:
    # it answers the customer's message too, but no person wrote it.
    if_(w, "Our reply?", OWN_REPLY + ".test(String($json.messageId || ''))", (100, 560))
    if_(w, "Answers a thread?", "!!$json.inReplyTo || [].concat($json.references || []).length > 0", (300, 420))
    noop(w, "Not a reply", (500, 300), "A person's new message, not an answer: nothing to reconcile.")
    setjson(w, "Human reply", "{op: 'human_reply', work_item_id: $json.inReplyTo || '', thread_ids: [].concat($json.references || []), "
            "message_id: $json.messageId || '', human_action: {kind: 'replied', text: ($json.text || '').slice(0, 2000), at: $json.date}}", (500, 420))
    setjson(w, "Sent copy", "{op: 'sent_copy', message_id: String($json.messageId)}", (300, 640))
    call(w, "Reconcile", ACT, (700, 420), alwaysOutputData=True)
    call(w, "Record the copy", ACT, (500, 640), alwaysOutputData=True)
    w.chain("Sent mail", "Each sent message")
    w.connect("Each sent message", "Our reply?", 1)
    w.connect("Our reply?", "Sent copy", 0)
    w.connect("Our reply?", "Answers a thread?", 1)
    w.connect("Answers a thread?", "Human reply", 0)
    w.connect("Answers a thread?", "Not a reply", 1)
    w.chain("Human reply", "Reconcile", "Each sent message")
    w.chain("Sent copy", "Record the copy", "Each sent message")
    w.connect("Not a reply", "Each sent message")
    return w


def intake_workflow():
    w = Workflow(INTAKE, "n8nbrain: webhook intake", save_data=False)
    note(w, "Read me", "## Intake from other sources (webhooks)\nFor e-mail that reaches n8n some other way than IMAP.\n\n"
         "* `POST /webhook/new-email` `{\"message_id\",\"from\",\"subject\",\"text\",\"to\"}` with `X-N8nbrain-Intake-Token` "
         "(credential *n8nbrain intake*, not the events secret): answers `200 {work_item_id, status, action}` once turn 1 "
         "is decided, the edge's status and error otherwise (a retry is always safe).\n"
         "* `POST /webhook/human-reply` `{\"work_item_id\",\"text\"}`: a person answered the thread; `closed_manual`.\n\n"
         "Replies go out through *n8nbrain: act* (SMTP). Without a Sent folder there is no copy to find, so an "
         "`unknown` send is verified as failed and escalated to a person. This workflow keeps no run data.", (-300, -460), h=400)
    w.node("New email", "n8n-nodes-base.webhook", 2, {
        "httpMethod": "POST", "path": "new-email", "authentication": "headerAuth",
        "responseMode": "responseNode", "options": {},
    }, (-300, 0), webhookId=str(uuid.uuid5(NS, "webhook/new-email")), credentials=CRED_INTAKE)
    # thread_id (optional): the thread's first message id, for the reply's
    # References, as the IMAP intake keeps it.
    first_turn(w, "Turn 1", "{message_id: String($json.body.message_id || ''), thread_id: $json.body.thread_id ? String($json.body.thread_id) : undefined, "
               "from: String($json.body.from || ''), "
               "to: Array.isArray($json.body.to) ? $json.body.to : [], subject: String($json.body.subject || ''), "
               "body: String($json.body.text || $json.body.body || '')}", (-80, 0))
    call(w, "Submit turn 1", TURN, (140, 0))
    if_(w, "Decided?", "$json.ok", (360, 0))
    w.node("200 decided", "n8n-nodes-base.respondToWebhook", 1.1, {
        "respondWith": "json", "options": {"responseCode": 200},
        "responseBody": "={{ JSON.stringify({work_item_id: $json.decision.work_item_id, status: $json.decision.status, action: ($json.decision.action || {}).name || null}) }}",
    }, (580, -80))
    setjson(w, "The decision", "{op: 'decision', decision: $('Submit turn 1').first().json.decision}", (800, -80))
    call(w, "Act on it", ACT, (1020, -80))
    w.node("Edge's answer", "n8n-nodes-base.respondToWebhook", 1.1, {
        "respondWith": "json", "options": {"responseCode": "={{ $json.status || 502 }}"},
        "responseBody": "={{ JSON.stringify({error: $json.error}) }}",
    }, (580, 100))
    stop(w, "Turn 1 refused", "'turn 1 not decided (' + $('Submit turn 1').first().json.status + '): ' + $('Submit turn 1').first().json.error.message", (800, 100))
    w.chain("New email", "Turn 1", "Submit turn 1", "Decided?")
    w.connect("Decided?", "200 decided", 0)
    w.connect("Decided?", "Edge's answer", 1)
    w.chain("200 decided", "The decision", "Act on it")
    w.chain("Edge's answer", "Turn 1 refused")

    w.node("Human reply", "n8n-nodes-base.webhook", 2, {
        "httpMethod": "POST", "path": "human-reply", "authentication": "headerAuth",
        "responseMode": "responseNode", "options": {},
    }, (-300, 400), webhookId=str(uuid.uuid5(NS, "webhook/human-reply")), credentials=CRED_INTAKE)
    setjson(w, "Reconcile op", "{op: 'human_reply', work_item_id: String($json.body.work_item_id || ''), human_action: "
            "{kind: 'replied', text: String($json.body.text || '').slice(0, 2000)}}", (-80, 400))
    call(w, "Reconcile", ACT, (140, 400))
    w.node("200 recorded", "n8n-nodes-base.respondToWebhook", 1.1, {
        "respondWith": "json", "responseBody": "={{ JSON.stringify({recorded: true}) }}", "options": {"responseCode": 200},
    }, (360, 400))
    w.chain("Human reply", "Reconcile op", "Reconcile", "200 recorded")
    return w


def main():
    out = os.path.join(HERE, "workflows")
    os.makedirs(out, exist_ok=True)
    for w in (turn_workflow(), act_workflow(), events_workflow(), imap_workflow(), intake_workflow()):
        with open(os.path.join(out, w.id + ".json"), "w") as f:
            json.dump(w.dump(), f, indent=2, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    main()
