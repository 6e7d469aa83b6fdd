// The web console in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core):
// a real `clink-wasm serve` on a loopback port, a tenant created over the API, then in the
// browser: sign in, see the quotas (and a quota lowered below usage), upload an invalid module and see each problem, upload a
// valid one and see it listed, delete it. Screenshots go to artifacts/ (or $ARTIFACTS).
//
//   CLINK_BIN=bin/clink-wasm node web/test/console.test.mjs     (make console-test)
import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import readline from "node:readline";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..", "..");
const bin = path.resolve(root, process.env.CLINK_BIN || "bin/clink-wasm");
const artifacts = path.resolve(process.env.ARTIFACTS || path.join(here, "artifacts"));
const fixtures = path.join(root, "host", "abi", "testdata");
const admin = "clk_admin_console-test-0123456789";
mkdirSync(artifacts, { recursive: true });

const data = mkdtempSync(path.join(tmpdir(), "clink-console-"));
const profile = mkdtempSync(path.join(tmpdir(), "clink-chromium-"));
const server = spawn(bin, ["serve", "--listen", "127.0.0.1:0", "--data", data], {
  env: { ...process.env, CLINK_ADMIN_TOKEN: admin }, stdio: ["ignore", "ignore", "pipe"],
});
let browser;
const cleanup = () => {
  try { server.kill("SIGKILL"); } catch {}
  rmSync(data, { recursive: true, force: true });
  rmSync(profile, { recursive: true, force: true });
};

function waitListening() {
  return new Promise((resolve, reject) => {
    const rl = readline.createInterface({ input: server.stderr });
    rl.on("line", (line) => {
      try {
        const rec = JSON.parse(line);
        if (rec.msg === "listening") resolve("http://" + rec.addr);
      } catch {}
    });
    server.on("exit", (code) => reject(new Error("server exited with " + code)));
  });
}

async function step(page, name) {
  const file = path.join(artifacts, name + ".png");
  await page.screenshot({ path: file, fullPage: true });
  console.log("  screenshot", path.relative(root, file));
}

try {
  const base = await waitListening();
  console.log("server at", base);
  const call = async (method, p, body) => {
    const r = await fetch(base + p, { method, headers: { Authorization: "Bearer " + admin, "Content-Type": "application/json" }, body: body && JSON.stringify(body) });
    assert.ok(r.ok, method + " " + p + ": " + r.status);
    return r.json();
  };
  const tenant = await call("POST", "/api/v1/tenants", { name: "acme", quotas: { max_pipelines: 4, guest_memory_bytes: 1048576 } });

  // A fresh profile every run (playwright passes it as --user-data-dir).
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1280, height: 860 },
  });
  const page = await browser.newPage();
  const failures = [];
  page.on("pageerror", (e) => failures.push("page error: " + e.message));
  page.on("console", (m) => { if (m.type() === "error" && !/status of (4|5)\d\d/.test(m.text())) failures.push("console: " + m.text()); });
  // Nothing may leave this origin: the console works offline.
  page.on("request", (r) => { if (!r.url().startsWith(base)) failures.push("off-origin request: " + r.url()); });

  // 1. A wrong token is refused; the right one signs in.
  await page.goto(base + "/");
  await page.fill("#token", "clk_t_wrong");
  await page.click("#signin-button");
  await page.waitForSelector("#signin-error:not([hidden])");
  assert.match(await page.textContent("#signin-error"), /not valid/);
  await page.fill("#token", tenant.token);
  await page.click("#signin-button");
  await page.waitForSelector("#app:not([hidden])");
  assert.equal(await page.textContent("#who-name"), "tenant acme");
  // 2. Quotas and usage.
  await page.waitForSelector('#quota-table tr[data-quota="guest_memory_bytes"]');
  assert.match(await page.textContent('#quota-table tr[data-quota="guest_memory_bytes"]'), /1 MiB/);
  assert.match(await page.textContent('#usage-cards [data-quota="Pipelines"]'), /0\s*\/ 4/);
  await step(page, "1-signed-in-quotas");

  // 3. An invalid module: each problem is shown.
  await page.click('.tabs button[data-tab="modules"]');
  await page.setInputFiles("#upload-file", path.join(fixtures, "noexports.wasm"));
  await page.click("#upload-button");
  await page.waitForSelector("#upload-problems");
  const problems = await page.$$eval("#upload-problems li", (lis) => lis.map((li) => li.textContent));
  assert.equal(problems.length, 3, "problems: " + problems.join(" | "));
  assert.ok(problems.some((p) => p.includes('missing export "memory"')), problems.join(" | "));
  await step(page, "2-invalid-module-problems");

  // 4. A module beyond the tenant's limits (enrich.wasm declares a lookup endpoint; no host is allowed).
  await page.setInputFiles("#upload-file", path.join(fixtures, "enrich.wasm"));
  await page.click("#upload-button");
  await page.waitForFunction(() => document.querySelector("#upload-problems")?.textContent.includes("allowed_lookup_hosts"));
  assert.match(await page.textContent("#upload-problems"), /quota/);
  await step(page, "3-module-over-quota");

  // 5. A valid module registers and is listed.
  await page.setInputFiles("#upload-file", path.join(fixtures, "counter.wasm"));
  await page.fill("#upload-name", "counter");
  await page.click("#upload-button");
  await page.waitForSelector("#upload-ok");
  assert.match(await page.textContent("#upload-ok"), /Registered counter@1/);
  await page.waitForSelector("#modules-table tbody tr");
  assert.match(await page.textContent("#modules-table tbody"), /counter.*1.*count/s);
  await step(page, "4-module-registered");

  // 6. The overview counts it.
  await page.click('.tabs button[data-tab="overview"]');
  await page.waitForFunction(() => /1\s*\/ 100/.test(document.querySelector('#usage-cards [data-quota="Modules"]')?.textContent || ""));
  await step(page, "5-usage-updated");

  // 6b. A quota lowered below usage: the overview says the tenant is over it (nothing stops).
  await call("PATCH", "/api/v1/tenants/acme", { quotas: { max_modules: 0 } });
  await page.click('.tabs button[data-tab="modules"]');
  await page.click('.tabs button[data-tab="overview"]');
  await page.waitForSelector('#usage-cards [data-over-quota="max_modules"]');
  assert.match(await page.textContent('#usage-cards [data-over-quota="max_modules"]'), /max_modules.*1 used of 0/s);
  await step(page, "5b-over-quota");
  await call("PATCH", "/api/v1/tenants/acme", { quotas: { max_modules: 100 } });
  await page.click('.tabs button[data-tab="modules"]');
  await page.click('.tabs button[data-tab="overview"]');
  await page.waitForFunction(() => !document.querySelector('#usage-cards [data-over-quota]'));

  // 7. A pipeline over it: a bad spec names the field at fault, a good one is listed.
  await page.click('.tabs button[data-tab="pipelines"]');
  await page.fill("#pipeline-name", "counts");
  await page.fill("#pipeline-spec", JSON.stringify({ operators: [{ module: "nosuch@9" }] }));
  await page.click("#pipeline-button");
  await page.waitForSelector("#pipeline-problem");
  assert.match(await page.textContent("#pipeline-problem"), /spec\.operators\[0\]\.module/);
  await page.fill("#pipeline-spec", JSON.stringify({
    checkpoints: { interval: "200ms" },
    sources: [{ name: "in", type: "http" }],
    operators: [{ name: "count", module: "counter@1", inputs: ["in"], key: "user", parallelism: 2 }],
    sinks: [{ name: "out", type: "preview", inputs: ["count"] }],
  }));
  await page.click("#pipeline-button");
  await page.waitForSelector("#pipeline-ok");
  await page.waitForFunction(() => /counts.*created/s.test(document.querySelector("#pipelines-table tbody")?.textContent || ""));
  await step(page, "6-pipeline-created");

  // 7b. Its detail: start it, ingest records, see throughput move and outputs arrive, stop it.
  await page.click("#pipelines-table tbody tr button.open-pipeline");
  await page.waitForSelector("#pipeline-detail:not([hidden])");
  await page.click("#detail-start");
  await page.waitForFunction(() => /running|starting/.test(document.querySelector("#detail-state")?.textContent || ""));
  const pid = (await call("GET", "/api/v1/pipelines?tenant=acme")).items[0].id;
  let seq = 0;
  const ingest = async () => {
    let body = "";
    for (let i = 0; i < 200; i++, seq++) body += JSON.stringify({ user: "u" + (seq % 7), seq }) + "\n";
    const r = await fetch(base + "/api/v1/pipelines/" + pid + "/records", { method: "POST", headers: { Authorization: "Bearer " + tenant.token, "Content-Type": "application/x-ndjson", "Idempotency-Key": "b-" + seq }, body });
    assert.equal(r.status, 200, "ingest: " + r.status + " " + (await r.text()));
  };
  const feeder = setInterval(() => ingest().catch((e) => failures.push("ingest: " + e.message)), 250);
  try {
    await page.waitForFunction(() => Number(document.querySelector("#detail-rate")?.textContent || 0) > 0, null, { timeout: 30000 });
    await page.waitForFunction(() => (document.querySelector("#detail-output")?.textContent || "").includes('{"count":'), null, { timeout: 30000 });
    await page.waitForSelector("#detail-checkpoints li");
    // The operator graph: its three nodes and two edges; the hot tier's hit ratio.
    await page.waitForSelector('#detail-graph g.node.source[data-node="in"]');
    await page.waitForSelector('#detail-graph g.node.operator[data-node="count"]');
    await page.waitForSelector('#detail-graph g.node.sink[data-node="out"]');
    assert.equal(await page.$$eval("#detail-graph path.edge", (es) => es.map((e) => e.dataset.edge).sort().join(",")), "count>out,in>count");
    assert.match(await page.textContent('#detail-graph g.node[data-node="count"]'), /counter@1 · \d+ rec/);
    await page.waitForFunction(() => /^\d+(\.\d)?%$/.test(document.querySelector("#hot-ratio")?.textContent || ""));
    assert.match(await page.textContent("#hot-detail"), /\d+ hits, \d+ misses/);
    assert.match(await page.textContent("#breakers"), /no lookup endpoints/);
    await step(page, "6b-pipeline-running");
  } finally {
    clearInterval(feeder);
  }
  await page.click("#detail-stop");
  await page.waitForFunction(() => /Stopped at savepoint #\d+/.test(document.querySelector("#detail-message")?.textContent || ""), null, { timeout: 30000 });
  await page.waitForFunction(() => document.querySelector("#detail-state")?.textContent === "stopped");
  await page.waitForSelector("#detail-checkpoints li.savepoint");
  await step(page, "6c-pipeline-stopped");
  // The module is in use now: deleting it shows why not.
  await page.click('.tabs button[data-tab="modules"]');
  page.once("dialog", (d) => d.accept());
  await page.click("#modules-table tbody tr button.danger");
  await page.waitForSelector("#modules-error:not([hidden])");
  assert.match(await page.textContent("#modules-error"), /in_use/);
  // Remove the pipeline over the API, then the module can go.
  const pls = await call("GET", "/api/v1/pipelines?tenant=acme");
  const del = await fetch(base + "/api/v1/pipelines/" + pls.items[0].id + "?tenant=acme", { method: "DELETE", headers: { Authorization: "Bearer " + admin } });
  assert.equal(del.status, 204);

  // 7c. A pipeline with a lookup endpoint on a closed loopback port: the detail's breaker panel
  // shows the endpoint's breaker, open. The enrich fixture POSTs, so the endpoint allows POST:
  // with the default methods (GET only) every lookup is refused by the methods rule before
  // anything is sent, and a refusal is excluded from the breaker's counts by design (it says
  // nothing of the upstream's health), which is why this panel used to show "closed". A failed
  // connect to the closed port is a breaker failure: the first record's attempts trip it (5
  // consecutive failures). The long cooldown keeps it open (not half-open) while we look.
  await call("PATCH", "/api/v1/tenants/acme", { quotas: { allowed_lookup_hosts: ["127.0.0.1:9"] } });
  const asTenant = (method, p, body, type = "application/json") => fetch(base + p, { method, headers: { Authorization: "Bearer " + tenant.token, "Content-Type": type }, body });
  let r = await asTenant("POST", "/api/v1/modules?name=enrich", readFileSync(path.join(fixtures, "enrich.wasm")), "application/wasm");
  assert.equal(r.status, 201, "enrich upload: " + (await r.text()));
  r = await asTenant("POST", "/api/v1/pipelines", JSON.stringify({ name: "lookups", spec: {
    sources: [{ name: "in", type: "http" }],
    operators: [{ name: "enrich", module: "enrich", inputs: ["in"], key: "user",
      endpoints: [{ name: "svc", base_url: "http://127.0.0.1:9", methods: ["POST"], egress: { allow_loopback: true }, breaker: { cooldown: "10m" } }] }],
    sinks: [{ name: "out", type: "preview", inputs: ["enrich"] }] } }));
  const created = await r.text();
  assert.equal(r.status, 201, "lookups pipeline: " + created);
  const lid = JSON.parse(created).id;
  assert.equal((await asTenant("POST", "/api/v1/pipelines/" + lid + "/start")).status, 202);
  let lbody = "";
  for (let i = 0; i < 40; i++) lbody += JSON.stringify({ user: "u" + i }) + "\n";
  assert.equal((await asTenant("POST", "/api/v1/pipelines/" + lid + "/records", lbody, "application/x-ndjson")).status, 200);
  await page.click('.tabs button[data-tab="pipelines"]');
  await page.waitForFunction(() => /lookups/.test(document.querySelector("#pipelines-table tbody")?.textContent || ""));
  await page.click('#pipelines-table tbody tr:has-text("lookups") button.open-pipeline');
  await page.waitForSelector('#breakers li[data-endpoint="svc"]', { timeout: 30000 });
  await page.waitForFunction(() => /svc\s*open$/.test(document.querySelector("#breakers")?.textContent || ""), null, { timeout: 30000 });
  assert.equal(await page.textContent('#breakers li[data-endpoint="svc"] span:last-child'), "open");
  assert.equal(await page.getAttribute('#breakers li[data-endpoint="svc"] span:last-child', "class"), "state-open");
  const lm = await (await asTenant("GET", "/api/v1/pipelines/" + lid + "/metrics")).json();
  assert.deepEqual(lm.breakers, [{ endpoint: "svc", origin: "http://127.0.0.1:9", state: "open" }]);
  await page.waitForSelector('#detail-graph g.node.operator[data-node="enrich"]');
  await step(page, "6d-breaker-panel");
  await asTenant("DELETE", "/api/v1/pipelines/" + lid);
  assert.equal((await asTenant("DELETE", "/api/v1/modules/" + (await (await asTenant("GET", "/api/v1/modules")).json()).items.find((m) => m.name === "enrich").id)).status, 204);
  await page.click("#detail-close").catch(() => {});

  // 8. Delete it.
  await page.click('.tabs button[data-tab="modules"]');
  page.once("dialog", (d) => d.accept());
  await page.click("#modules-table tbody tr button.danger");
  await page.waitForSelector("#modules-empty:not([hidden])");
  await step(page, "7-module-deleted");

  // 9. The admin signs in too, picks the tenant, and sees every tenant's usage.
  await page.click("#sign-out");
  await page.fill("#token", admin);
  await page.click("#signin-button");
  await page.waitForSelector("#tenant-pick:not([hidden])");
  assert.equal(await page.textContent("#who-name"), "admin");
  assert.equal(await page.inputValue("#tenant-pick"), "acme");
  await page.click('.tabs button[data-tab="tenants"]');
  await page.waitForSelector("#tenants-table tbody tr");
  assert.match(await page.textContent("#tenants-table tbody"), /acme/);
  await step(page, "8-admin-tenants");

  assert.deepEqual(failures, []);
  console.log("console test: ok");
} catch (err) {
  console.error("console test FAILED:", err);
  process.exitCode = 1;
} finally {
  if (browser) await browser.close();
  cleanup();
}
