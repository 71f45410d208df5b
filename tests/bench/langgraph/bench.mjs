// The LangGraph baseline of BENCHMARKS.md (DESIGN §7a): a LangGraph.js graph
// equivalent to one turn with the model stubbed out, its state persisted per
// thread (= work item) by LangGraph's Postgres checkpointer in a database of
// the same Postgres cluster the brain uses.
//
//   START -> load -> classify -> (confident rule) decide -> END
//                             \-> (otherwise)     model (stub) -> decide
//
// load checks the turn against the thread's state (which the checkpointer
// loaded), classify applies the same keyword rule the Go benchmark's tenant
// has, decide picks the action from a closed catalogue and builds the
// decision. Each invocation is turn 1 of a new thread, as each Go iteration
// is turn 1 of a new work item.
//
// Environment:
//   BRAIN_TEST_DATABASE_URL  admin URL of the cluster (creates, then drops, a
//                            login role and a database of its own)
//   BENCH_N                  invocations per mode (default 2000)
//   BENCH_CONCURRENCY        concurrent invocations (default 16)
//   BENCH_WARMUP             untimed invocations first (default 50)
//   LG_DURABILITY            LangGraph durability modes to run, comma separated
//                            (default "async,exit": LangGraph's default, and
//                            its cheapest mode, one checkpoint per invocation)
//   LG_PROCS                 also run the concurrent callers spread over this
//                            many Node processes (default 2; 1 to skip): one
//                            Node process runs JavaScript on one core only
//
// Prints one JSON object per line: {"mode": ..., "durability": ..., "procs": ...,
// "p50_us": ..., "turns_per_s": ...}.

import { fork } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";

import { Annotation, END, START, StateGraph } from "@langchain/langgraph";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";
import pg from "pg";

// No tracing, no network: the baseline talks to the local Postgres only.
process.env.LANGSMITH_TRACING = "false";
process.env.LANGCHAIN_TRACING_V2 = "false";

const adminURL = process.env.BRAIN_TEST_DATABASE_URL;
if (!adminURL) {
  console.error("BRAIN_TEST_DATABASE_URL is not set (run through tests/bench/run.sh or `make bench`)");
  process.exit(2);
}
const N = Number(process.env.BENCH_N ?? 2000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 16);
const WARMUP = Number(process.env.BENCH_WARMUP ?? 50);
const DURABILITIES = (process.env.LG_DURABILITY ?? "async,exit").split(",").map((s) => s.trim()).filter(Boolean);
const PROCS = Number(process.env.LG_PROCS ?? 2);

// ---------------------------------------------------------------- the graph

const State = Annotation.Root({
  work_item_id: Annotation(),
  turn: Annotation(),
  email: Annotation(),
  last_turn: Annotation({ reducer: (_, b) => b, default: () => 0 }),
  status: Annotation(),
  assessment: Annotation(),
  action: Annotation(),
  decision: Annotation(),
});

// The same rule as the Go benchmark's tenant ("quotes", tests/harness_test.go).
const RULES = [
  {
    name: "quotes", subjectKeywords: ["quote"], category: "quote_request", priority: "high", confidence: 0.95,
    action: "draft_reply",
    params: { subject: "Re: your quote request", body: "Thanks, we will send a quote shortly.", tone: "friendly" },
  },
  {
    name: "invoices", subjectKeywords: ["invoice"], category: "invoice", priority: "normal", confidence: 0.9,
    action: "close_item", params: { resolution: "invoices are handled by accounts" },
  },
];
const CONFIDENT = 0.9;
// A closed catalogue: what each action is and whether a human approves it.
const CATALOGUE = {
  draft_reply: { requiresApproval: true },
  close_item: { requiresApproval: false },
  escalate_item: { requiresApproval: false },
};

function load(state) {
  // The checkpointer loaded the thread's state; the turn must follow it.
  const expected = (state.last_turn ?? 0) + 1;
  if (state.turn !== expected) {
    return { status: "rejected", decision: { error: "turn_out_of_sequence", expected_turn: expected } };
  }
  return {};
}

function classify(state) {
  if (state.status === "rejected") return {};
  const subject = (state.email?.subject ?? "").toLowerCase();
  const rule = RULES.find((r) => r.subjectKeywords.some((k) => subject.includes(k)));
  if (!rule) return { assessment: { category: "unknown", priority: "normal", confidence: 0, source: "none" } };
  return {
    assessment: { category: rule.category, priority: rule.priority, confidence: rule.confidence, source: "rule", rule: rule.name },
    action: { name: rule.action, params: rule.params },
  };
}

// The model, stubbed: never reached by the benchmark's confident rule.
function model(state) {
  return {
    assessment: { category: "other", priority: "normal", confidence: 0.5, source: "model" },
    action: { name: "escalate_item", params: { reason: "stub model" } },
  };
}

function decide(state) {
  if (state.status === "rejected") return {};
  const a = state.action;
  const entry = a && CATALOGUE[a.name];
  let status = "open";
  let action = null;
  if (!entry) {
    status = "escalated";
  } else {
    action = { name: a.name, params: a.params, requires_approval: entry.requiresApproval };
    if (entry.requiresApproval) status = "awaiting_approval";
    else if (a.name === "close_item") status = "closed";
    else if (a.name === "escalate_item") status = "escalated";
  }
  return {
    status,
    last_turn: state.turn,
    decision: {
      work_item_id: state.work_item_id, turn: state.turn, next_turn: state.turn + 1, replayed: false,
      catalogue_version: 1, status, assessment: state.assessment, action,
    },
  };
}

function buildGraph(checkpointer) {
  return new StateGraph(State)
    .addNode("load", load)
    .addNode("classify", classify)
    .addNode("model", model)
    .addNode("decide", decide)
    .addEdge(START, "load")
    .addEdge("load", "classify")
    .addConditionalEdges("classify", (s) =>
      s.status === "rejected" || (s.assessment?.confidence ?? 0) >= CONFIDENT ? "decide" : "model", ["decide", "model"])
    .addEdge("model", "decide")
    .addEdge("decide", END)
    .compile({ checkpointer });
}

// ---------------------------------------------------------------- measuring

function pct(sorted, p) {
  if (sorted.length === 0) return 0;
  return sorted[Math.max(Math.ceil(p * sorted.length) - 1, 0)];
}

function summary(mode, lat, elapsedMs, extra) {
  const s = Float64Array.from(lat).sort();
  const r = (x) => Math.round(x * 10) / 10;
  return {
    mode, n: lat.length, ...extra,
    p50_us: r(pct(s, 0.5) * 1000), p90_us: r(pct(s, 0.9) * 1000), p99_us: r(pct(s, 0.99) * 1000),
    turns_per_s: r(lat.length / (elapsedMs / 1000)),
  };
}

const run = randomBytes(4).toString("hex");
let seq = 0;
function input() {
  const id = `<lg-${run}-${++seq}@customer.example>`;
  return {
    id,
    state: {
      work_item_id: id, turn: 1,
      email: {
        message_id: id, from: "Jo Bloggs <jo@customer.example>", subject: "Quote for a new deck please",
        body: "Hi, could you quote for a 20m2 hardwood deck? Thanks, Jo",
      },
    },
  };
}

async function turn(graph, durability) {
  const { id, state } = input();
  const t0 = performance.now();
  const out = await graph.invoke(state, { configurable: { thread_id: id }, durability });
  const d = performance.now() - t0;
  if (out.status !== "awaiting_approval" || out.decision?.action?.name !== "draft_reply") {
    throw new Error(`unexpected decision: ${JSON.stringify(out.decision)}`);
  }
  return d;
}

async function sequential(graph, durability, n) {
  const lat = [];
  const start = performance.now();
  for (let i = 0; i < n; i++) lat.push(await turn(graph, durability));
  return [lat, performance.now() - start];
}

async function concurrent(graph, durability, n, c) {
  const lat = [];
  let next = 0;
  const worker = async () => {
    while (next < n) {
      next++;
      lat.push(await turn(graph, durability));
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: c }, worker));
  return [lat, performance.now() - start];
}

// ---------------------------------------------------------------- main

function versionOf(pkg) {
  return JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url))).version;
}

function openGraph(url, max) {
  const pool = new pg.Pool({ connectionString: url, max });
  // An idle connection closed under the pool (the database is dropped at
  // the end) is not an error of the benchmark.
  pool.on("error", () => {});
  return [pool, new PostgresSaver(pool)];
}

// A child process: CONCURRENCY/PROCS callers of its own, started on "go".
async function child() {
  const { LG_CHILD_URL: url, LG_CHILD_N: n, LG_CHILD_C: c, LG_CHILD_DURABILITY: durability } = process.env;
  const [pool, checkpointer] = openGraph(url, Number(c));
  const graph = buildGraph(checkpointer);
  for (let i = 0; i < WARMUP; i++) await turn(graph, durability);
  await concurrent(graph, durability, Number(c), Number(c));
  process.send({ ready: true });
  await new Promise((resolve) => process.once("message", resolve));
  const [lat] = await concurrent(graph, durability, Number(n), Number(c));
  process.send({ lat });
  await pool.end();
  process.disconnect();
}

// concurrentProcs runs n invocations from CONCURRENCY callers spread over
// procs Node processes (Node runs JavaScript on one core per process).
async function concurrentProcs(url, durability, n, procs) {
  const kids = [];
  for (let i = 0; i < procs; i++) {
    const share = Math.floor(n / procs) + (i < n % procs ? 1 : 0);
    const env = { ...process.env, LG_CHILD_URL: url, LG_CHILD_N: String(share),
      LG_CHILD_C: String(Math.ceil(CONCURRENCY / procs)), LG_CHILD_DURABILITY: durability };
    const kid = fork(fileURLToPath(import.meta.url), [], { env });
    const ready = new Promise((resolve, reject) => {
      kid.once("message", resolve);
      kid.once("exit", (code) => reject(new Error(`child exited ${code}`)));
    });
    kids.push({ kid, ready });
  }
  await Promise.all(kids.map((k) => k.ready));
  const done = kids.map(({ kid }) => new Promise((resolve, reject) => {
    kid.once("message", (m) => resolve(m.lat));
    kid.once("exit", (code) => reject(new Error(`child exited ${code}`)));
  }));
  const start = performance.now();
  for (const { kid } of kids) kid.send("go");
  const lat = (await Promise.all(done)).flat();
  const elapsed = performance.now() - start;
  await Promise.all(kids.map(({ kid }) => new Promise((resolve) => kid.exitCode !== null ? resolve() : kid.once("exit", resolve))));
  return [lat, elapsed];
}

async function main() {
  const name = `lg_bench_${run}`;
  const password = randomBytes(18).toString("base64url");
  const admin = new pg.Client({ connectionString: adminURL });
  await admin.connect();
  const ident = (s) => `"${s.replaceAll('"', '""')}"`;
  // A plain login role (no superuser) owning a database of its own.
  await admin.query(`CREATE ROLE ${ident(name)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '${password}'`);
  await admin.query(`CREATE DATABASE ${ident(name)} OWNER ${ident(name)}`);
  let pool;
  let failed = false;
  try {
    const url = new URL(adminURL);
    url.username = name;
    url.password = password;
    url.pathname = `/${name}`;
    // One connection per concurrent caller: no invocation waits for the pool.
    let checkpointer;
    [pool, checkpointer] = openGraph(url.toString(), CONCURRENCY);
    await checkpointer.setup();
    const graph = buildGraph(checkpointer);
    const meta = {
      node: process.version, langgraph: versionOf("@langchain/langgraph"),
      checkpoint_postgres: versionOf("@langchain/langgraph-checkpoint-postgres"),
    };
    for (const durability of DURABILITIES) {
      for (let i = 0; i < WARMUP; i++) await turn(graph, durability);
      const [seqLat, seqMs] = await sequential(graph, durability, N);
      console.log(JSON.stringify(summary("sequential", seqLat, seqMs, { durability, procs: 1, ...meta })));
      await concurrent(graph, durability, CONCURRENCY, CONCURRENCY); // warm every connection
      const [conLat, conMs] = await concurrent(graph, durability, N, CONCURRENCY);
      console.log(JSON.stringify(summary(`concurrent${CONCURRENCY}`, conLat, conMs, { durability, procs: 1, ...meta })));
      if (PROCS > 1) {
        const [pLat, pMs] = await concurrentProcs(url.toString(), durability, N, PROCS);
        console.log(JSON.stringify(summary(`concurrent${CONCURRENCY}`, pLat, pMs, { durability, procs: PROCS, ...meta })));
      }
    }
    const { rows } = await pool.query(`SELECT count(DISTINCT thread_id)::int AS threads, count(*)::int AS checkpoints FROM checkpoints`);
    console.error(`langgraph: ${rows[0].threads} threads, ${rows[0].checkpoints} checkpoints stored`);
  } catch (e) {
    failed = true;
    console.error(e);
  } finally {
    await pool?.end();
    await admin.query(`DROP DATABASE IF EXISTS ${ident(name)} WITH (FORCE)`);
    await admin.query(`DROP ROLE IF EXISTS ${ident(name)}`);
    await admin.end();
  }
  process.exit(failed ? 1 : 0);
}

if (process.env.LG_CHILD_URL) {
  await child();
} else {
  await main();
}
