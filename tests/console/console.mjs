// The web console in a real Chromium (playwright-core), run by
// tests/tests/console.rs against a daemon it started with `shop`:
// orders -> check (identity) -> checked -> work (fail: rejects all) -> done,
// ten orders in work's DLQ (even ones keyed `red`, odd ones `blue`).
//
// Environment: SLUICE_URL, SLUICE_FULL_TOKEN, SLUICE_READ_TOKEN,
// SLUICE_CHROMIUM, SLUICE_SCREENSHOT_DIR, SLUICE_PIPELINE_FILE (the loaded
// pipeline file) and SLUICE_PIPELINE_FIXED (the same with `work` fixed).
// Exits 0 when every check holds; otherwise prints what failed, saves a
// screenshot of the page to $TMPDIR/sluice-console-failure.png and exits 1.
// The browser, sign-in, polling and that exit are page.mjs's, shared with
// state.mjs.

import { copyFileSync } from 'node:fs';
import { check, env, openConsole, testid, until, WAIT } from './page.mjs';

const URL_BASE = env('SLUICE_URL');
const FULL = env('SLUICE_FULL_TOKEN');
const READ = env('SLUICE_READ_TOKEN');
const PIPELINE = 'shop';
const STAGE = 'work';
/** How many of the `red` matches are selected and redriven (console.rs: REDRIVEN). */
const REDRIVE = 3;

const { page, pageFetch, getJson, shot, go, bannerText, noBanner, signIn, noPageProblems, runAndExit } = await openConsole({
  /** Resource failures the test causes on purpose: the sign-in probe (401), refused writes (403). */
  tolerate: /Failed to load resource: the server responded with a status of (401|403)/,
});

async function run() {
  // ---- 5 (first half): the CSP header on /ui and its assets.
  const response = await page.goto(`${URL_BASE}/ui/`);
  check(response.status() === 200, 'GET /ui/ is 200');
  const csp = response.headers()['content-security-policy'] || '';
  for (const directive of ["default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"]) {
    check(csp.includes(directive), `the CSP has ${directive} (${csp})`);
  }
  for (const asset of ['/ui/app.js', '/ui/app.css', '/ui']) {
    const r = await page.request.get(`${URL_BASE}${asset}`);
    check(r.status() === 200, `GET ${asset} is 200`);
  }

  // ---- 1: sign in; a wrong token first shows the server's error.
  await page.waitForSelector(testid('signin-form'));
  await page.fill(testid('signin-token'), 'not-the-token');
  await page.click(testid('signin-submit'));
  const refused = await until(bannerText, 'the sign-in error banner');
  check(/refused/i.test(refused), `a wrong token is refused in a banner: ${refused}`);
  await signIn(FULL, 'full');
  check(await page.isVisible(testid('sign-out')), 'the sign-out button shows');

  // ---- 2: the overview's numbers are those of the /v1/status it drew.
  await page.waitForSelector(testid(`stage-depth-${PIPELINE}-${STAGE}`));
  const renders = () => page.evaluate(() => Number(document.querySelector('[data-testid="overview"]').dataset.renders || 0));
  const shownNumbers = () => page.evaluate(() => {
    const out = {};
    for (const el of document.querySelectorAll('[data-testid^="stage-"][data-value]')) out[el.dataset.testid] = el.dataset.value;
    return out;
  });
  let compared = false;
  for (let attempt = 0; attempt < 4 && !compared; attempt += 1) {
    const before = await renders();
    const polled = await page.waitForResponse((r) => new URL(r.url()).pathname === '/v1/status', { timeout: WAIT });
    const status = await polled.json();
    await page.waitForFunction((n) => Number(document.querySelector('[data-testid="overview"]').dataset.renders || 0) > n, before, { timeout: WAIT });
    const shown = await shownNumbers();
    const mismatches = [];
    for (const st of status) {
      const key = `${st.pipeline}-${st.stage}`;
      for (const [field, id] of [['depth', 'depth'], ['dlq_depth', 'dlq'], ['in_flight', 'inflight'], ['processed_per_sec', 'rate'], ['oldest_age_seconds', 'oldest']]) {
        const want = st[field] === null || st[field] === undefined ? '' : String(st[field]);
        if (shown[`stage-${id}-${key}`] !== want) mismatches.push(`${id}-${key}: shown ${shown[`stage-${id}-${key}`]}, status ${want}`);
      }
    }
    if (mismatches.length === 0) compared = true;
    else console.log(`# overview and the poll differ (a later poll may have drawn it): ${mismatches.join('; ')}`);
  }
  check(compared, 'the overview shows the numbers of the /v1/status answer it polled');
  // And against a fresh /v1/status from the page (quiescent: the same).
  const fresh = await getJson('/v1/status');
  const shown = await shownNumbers();
  for (const st of fresh) {
    const key = `${st.pipeline}-${st.stage}`;
    check(shown[`stage-depth-${key}`] === String(st.depth), `overview backlog of ${key} = ${st.depth}`);
    check(shown[`stage-dlq-${key}`] === String(st.dlq_depth), `overview DLQ of ${key} = ${st.dlq_depth}`);
    check(shown[`stage-inflight-${key}`] === String(st.in_flight), `overview in-flight of ${key} = ${st.in_flight}`);
  }
  check(shown[`stage-dlq-${PIPELINE}-${STAGE}`] === '10', 'work shows 10 dead letters');
  const text = await page.textContent(testid(`stage-dlq-${PIPELINE}-${STAGE}`));
  check(text.trim() === '10', 'the DLQ count reads 10');
  for (const t of ['orders', 'checked', 'done']) check(await page.isVisible(testid(`topic-${t}`)), `topic ${t} is drawn`);
  check(await page.locator('svg.edges path').count() >= 8, 'the graph has its edges');
  await noBanner('on the overview');
  await shot('overview');

  // ---- the stage view: graphs, config, pause and resume. The daemon
  // takes a history point every 10 s: wait for two, so the graphs draw
  // lines from the daemon's own history.
  await until(async () => (await getJson(`/v1/stages/${PIPELINE}/${STAGE}`)).history.points.length >= 2,
    'two history points of the stage', 45000);
  await go(`#/stage/${PIPELINE}/${STAGE}`);
  await until(async () => (await page.locator(`${testid('chart-latency')} svg[viewBox] path`).count()) > 0, 'the latency graph drawn');
  const history = (await getJson(`/v1/stages/${PIPELINE}/${STAGE}`)).history.points;
  const deadLettered = history.reduce((n, p) => n + (p.outcomes['dead-lettered'] || 0), 0);
  check(deadLettered === 10, `the history counts the 10 dead letters (${deadLettered})`);
  const rejected = history.reduce((n, p) => n + (p.failures.rejected || 0), 0);
  check(rejected === 10, `the history counts their failures by kind: rejected (${rejected})`);
  check(await page.locator(`${testid('chart-failures')} svg[viewBox] rect`).count() > 0, 'the failures graph has bars');
  check(!(await page.textContent(testid('chart-rate'))).includes('No data yet'), 'the throughput graph has data');
  await page.waitForSelector(testid('chart-failures'));
  await until(async () => (await page.textContent(testid('stage-config'))).includes('"publish"'), 'the stage config');
  const config = await page.textContent(testid('stage-config'));
  check(config.includes('warehouse is closed'), 'the stage view shows its config as loaded');
  await until(async () => (await page.textContent(testid('stage-view-state'))) === 'running', 'the stage state');
  await page.click(testid('stage-pause'));
  await until(async () => (await page.textContent(testid('stage-view-state'))) === 'paused', 'the stage paused');
  check((await getJson('/v1/status')).find((s) => s.stage === STAGE).paused === true, 'pause took effect in /v1/status');
  await page.click(testid('stage-resume'));
  await until(async () => (await page.textContent(testid('stage-view-state'))) === 'running', 'the stage resumed');
  check((await getJson('/v1/status')).find((s) => s.stage === STAGE).paused === false, 'resume took effect in /v1/status');
  await noBanner('on the stage view');
  await shot('stage');

  // ---- 3: search the DLQ by key, select some, fix the stage, redrive.
  await go(`#/dlq/${PIPELINE}/${STAGE}`);
  await until(async () => (await page.locator('tr[data-seq]').count()) === 10, 'ten DLQ rows');
  await page.fill(testid('dlq-key'), 'red');
  await page.click(testid('dlq-search-submit'));
  await until(async () => (await page.locator('tr[data-seq]').count()) === 5, 'five rows keyed red');
  const seqs = await page.$$eval('tr[data-seq]', (rows) => rows.map((r) => Number(r.dataset.seq)));
  const viaApi = await getJson(`/v1/dlq/${PIPELINE}/${STAGE}?key=red`);
  check(JSON.stringify(viaApi.entries.map((e) => e.seq)) === JSON.stringify(seqs), `the search shows what the API lists for key=red: ${seqs}`);
  const chosen = seqs.slice(0, REDRIVE);
  const left = seqs.slice(REDRIVE);
  const payloads = {};
  for (const seq of seqs) payloads[seq] = (await getJson(`/v1/dlq/${PIPELINE}/${STAGE}/${seq}`)).payload;
  for (const seq of chosen) await page.check(testid(`dlq-select-${seq}`));
  check((await page.textContent(testid('dlq-redrive-selected'))).includes(`(${REDRIVE})`), 'the redrive button counts the selection');
  await shot('dlq');

  // Fix `work` (the fixed pipeline file, then a reload), as an operator would.
  const { csrf } = await getJson('/ui/session');
  copyFileSync(env('SLUICE_PIPELINE_FIXED'), env('SLUICE_PIPELINE_FILE'));
  const reload = await pageFetch('POST', '/v1/reload', { body: {}, csrf });
  check(reload.status === 200 && reload.json.ok === true, `the reload applied (${reload.status} ${reload.text.slice(0, 300)})`);

  await page.click(testid('dlq-redrive-selected'));
  await page.waitForSelector(`${testid('confirm')}[open]`);
  const count = await page.textContent(testid('confirm-count'));
  check(count === String(REDRIVE), `the dry run counts ${REDRIVE} in the dialog (${count})`);
  await page.click(testid('confirm-ok'));
  await until(async () => (await page.textContent(testid('notice'))).includes(`Redriven: ${REDRIVE}`), 'the redrive notice');
  await until(async () => (await page.locator('tr[data-seq]').count()) === 5 - REDRIVE, 'the redriven rows gone');

  // Exactly the redriven orders come out of `done`; the others stay.
  const done = await until(async () => {
    const page_ = await getJson('/v1/topics/done/messages?from=0&max=1000');
    return page_.messages.length >= REDRIVE ? page_ : null;
  }, 'the redriven orders in done');
  await until(async () => {
    const st = (await getJson('/v1/status')).find((s) => s.stage === STAGE);
    return st.depth === 0 && st.in_flight === 0;
  }, 'work quiescent again');
  const out = (await getJson('/v1/topics/done/messages?from=0&max=1000')).messages.map((m) => m.payload).sort();
  check(done.messages.length === REDRIVE && out.length === REDRIVE, `done holds ${REDRIVE} messages`);
  check(JSON.stringify(out) === JSON.stringify(chosen.map((s) => payloads[s]).sort()), 'done holds exactly the selected orders');
  const after = await getJson(`/v1/dlq/${PIPELINE}/${STAGE}`);
  const afterSeqs = after.entries.map((e) => e.seq);
  check(after.entries.length === 10 - REDRIVE, `the DLQ keeps ${10 - REDRIVE} entries`);
  check(chosen.every((s) => !afterSeqs.includes(s)), 'the redriven entries left the DLQ');
  check(left.every((s) => afterSeqs.includes(s)), 'the unselected red entries stayed');

  // ---- the message view: payload as text, JSON and hex; headers; provenance.
  const kept = left[0];
  await go(`#/dlq/${PIPELINE}/${STAGE}/${kept}`);
  await page.waitForSelector(testid('payload'));
  check((await page.textContent(testid('entry-error'))).includes('warehouse is closed'), 'the entry shows its error');
  check((await page.textContent(testid('entry-key'))) === 'red', 'the entry shows its key');
  check((await page.textContent(testid('entry-headers'))).includes('region'), 'the entry shows its headers');
  check((await page.textContent(testid('entry-provenance'))).toLowerCase().includes('sluice-dlq'), 'the entry shows its provenance');
  await page.click(testid('payload-hex'));
  check((await page.textContent(testid('payload'))).startsWith('00000000  7b'), 'hex view');
  await page.click(testid('payload-text'));
  check((await page.textContent(testid('payload'))) === payloads[kept], 'text view is the payload');
  await page.click(testid('payload-json'));
  check((await page.textContent(testid('payload'))) === JSON.stringify(JSON.parse(payloads[kept]), null, 2), 'pretty JSON view');
  await noBanner('on the message view');
  await shot('dlq-message');

  // ---- the topic view: a live tail that follows and pauses.
  await go('#/topic/done');
  await until(async () => (await page.locator(testid('tail-message')).count()) === REDRIVE, 'the tail shows the stored messages');
  const publish = async (payload) => {
    const r = await pageFetch('POST', '/v1/topics/done/messages', { body: payload, csrf, contentType: 'text/plain' });
    check(r.status === 202, `published ${payload} (${r.status} ${r.text})`);
  };
  await publish('live-1');
  await until(async () => (await page.textContent(testid('topic-tail'))).includes('live-1'), 'the tail following live');
  await page.click(testid('topic-pause'));
  check((await page.textContent(testid('topic-state'))) === 'paused', 'the tail pauses');
  await publish('live-2');
  await page.click(testid('topic-pause'));
  await until(async () => (await page.textContent(testid('topic-tail'))).includes('live-2'), 'the tail resumed');
  await noBanner('on the topic view');
  await shot('topic');

  // ---- 4: sign out; the read token sees no write button, and the server refuses writes.
  await page.click(testid('sign-out'));
  await page.waitForSelector(testid('signin-form'));
  check((await pageFetch('GET', '/ui/session')).status === 401, 'signed out: the session is gone');
  check((await pageFetch('GET', '/v1/status')).status === 401, 'signed out: /v1 answers 401');
  await signIn(READ, 'read');
  await page.waitForSelector(testid(`stage-depth-${PIPELINE}-${STAGE}`));
  await go(`#/stage/${PIPELINE}/${STAGE}`);
  await until(async () => (await page.textContent(testid('stage-view-state'))) === 'running', 'the stage view (read)');
  check(await page.locator(testid('stage-pause')).count() === 0, 'read: no pause button');
  check(await page.locator(testid('stage-resume')).count() === 0, 'read: no resume button');
  await go(`#/dlq/${PIPELINE}/${STAGE}`);
  await until(async () => (await page.locator('tr[data-seq]').count()) === 10 - REDRIVE, 'the DLQ list (read)');
  check(await page.locator(testid('dlq-actions')).count() === 0, 'read: no redrive or purge buttons');
  check(!(await page.isVisible(testid(`dlq-select-${kept}`))), 'read: no selection boxes');
  await go(`#/dlq/${PIPELINE}/${STAGE}/${kept}`);
  await page.waitForSelector(testid('payload'));
  check(await page.locator(testid('entry-redrive')).count() === 0, 'read: no redrive on the message view');

  const readCsrf = (await getJson('/ui/session')).csrf;
  check((await getJson('/ui/session')).role === 'read', 'the session is read-only');
  const writes = [
    ['POST', `/v1/dlq/${PIPELINE}/${STAGE}/redrive`, { body: { dry_run: false, filter: { seq: [kept] } } }],
    ['POST', `/v1/dlq/${PIPELINE}/${STAGE}/purge`, { body: { all: true } }],
    ['POST', `/v1/stages/${PIPELINE}/${STAGE}/pause`, {}],
    ['POST', `/v1/stages/${PIPELINE}/${STAGE}/resume`, {}],
    ['POST', '/v1/reload', { body: {} }],
    ['POST', '/v1/topics/orders/messages', { body: 'from a read session', contentType: 'text/plain' }],
    ['POST', '/v1/topics/orders/batch', { body: '{"payload":"from a read session"}\n', contentType: 'application/x-ndjson' }],
  ];
  for (const [method, path, opts] of writes) {
    const r = await pageFetch(method, path, { ...opts, csrf: readCsrf });
    check(r.status === 403, `read session: ${method} ${path} is 403 (${r.status} ${r.text.slice(0, 200)})`);
    check(r.json && typeof r.json.error === 'string', `read session: ${method} ${path} says why in JSON`);
  }
  const dlqAfter = await getJson(`/v1/dlq/${PIPELINE}/${STAGE}`);
  check(dlqAfter.entries.length === 10 - REDRIVE, 'the refused writes changed nothing in the DLQ');
  check((await getJson('/v1/status')).every((s) => !s.paused), 'the refused writes paused nothing');
  const ordersBefore = (await getJson('/v1/topics/orders')).last_seq;
  check(ordersBefore === 10, `nothing was published by the read session (orders last_seq ${ordersBefore})`);

  // DELETE /ui/session is the one write a read session may do.
  await page.click(testid('sign-out'));
  await page.waitForSelector(testid('signin-form'));
  check((await pageFetch('GET', '/ui/session')).status === 401, 'the read session signed out');

  // A full session's write without (or with a wrong) CSRF header: 403.
  await signIn(FULL, 'full');
  const noCsrf = await pageFetch('POST', `/v1/stages/${PIPELINE}/${STAGE}/pause`);
  check(noCsrf.status === 403, `full session without the CSRF header: 403 (${noCsrf.status} ${noCsrf.text})`);
  const wrongCsrf = await pageFetch('POST', `/v1/stages/${PIPELINE}/${STAGE}/pause`, { csrf: '00'.repeat(16) });
  check(wrongCsrf.status === 403, `full session with a wrong CSRF header: 403 (${wrongCsrf.status})`);
  const noCsrfPurge = await pageFetch('POST', `/v1/dlq/${PIPELINE}/${STAGE}/purge`, { body: { all: true } });
  check(noCsrfPurge.status === 403, `full session purge without the CSRF header: 403 (${noCsrfPurge.status})`);
  check((await getJson('/v1/status')).every((s) => !s.paused), 'nothing paused without CSRF');
  check((await getJson(`/v1/dlq/${PIPELINE}/${STAGE}`)).entries.length === 10 - REDRIVE, 'nothing purged without CSRF');

  // ---- 5 (second half): no console errors, no CSP violations.
  await noPageProblems();
}

await runAndExit('console.mjs', 'sluice-console-failure.png', run);
