// The console's state view (#/state/P/S) in a real Chromium (playwright-core),
// run by tests/tests/console.rs against a daemon it started with `st`:
// in -> count (the `stateful` test plugin, `state: true`) -> out -> relay
// (identity, no state) -> done. It published `inc` three times keyed `red`
// and twice keyed `<b>blue</b>&` (ids m-0 .. m-4), so the store holds
// count/red = 3, count/<b>blue</b>& = 2 and seen/m-0 .. seen/m-4.
//
// Environment: SLUICE_URL, SLUICE_FULL_TOKEN, SLUICE_READ_TOKEN,
// SLUICE_CHROMIUM, SLUICE_SCREENSHOT_DIR. Exits 0 when every check holds;
// otherwise prints what failed, saves a screenshot to
// $TMPDIR/sluice-console-state-failure.png and exits 1.
// The browser, sign-in, polling and that exit are page.mjs's, shared with
// console.mjs.

import { check, env, openConsole, testid, until } from './page.mjs';

const URL_BASE = env('SLUICE_URL');
const FULL = env('SLUICE_FULL_TOKEN');
const READ = env('SLUICE_READ_TOKEN');
const API = '/v1/state/st/count';
const RED = 'count/red';
/** A key with markup: shown as text, and escaped in the value's and delete's paths. */
const MARKUP = 'count/<b>blue</b>&';
const SEEN = ['seen/m-0', 'seen/m-1', 'seen/m-2', 'seen/m-3', 'seen/m-4'];
const ALL_KEYS = [MARKUP, RED, ...SEEN];

const row = (key) => `tr[data-key=${JSON.stringify(key)}]`;

const { page, pageFetch, getJson, shot, go, noBanner, signIn, noPageProblems, runAndExit } = await openConsole({
  /** The sign-in probe (401) and the read session's value request made on purpose (403). */
  tolerate: /Failed to load resource: the server responded with a status of (401|403)/,
});
/** Every request the page makes for a value (`.../keys/...`), by method. */
const valueRequests = [];
page.on('request', (r) => {
  const path = new URL(r.url()).pathname;
  if (path.startsWith(`${API}/keys/`)) valueRequests.push(`${r.method()} ${path}`);
});

const keyPath = (key) => `${API}/keys/${encodeURIComponent(key)}`;

/** The rows of the state table: [key, size] as shown. */
const shownRows = () => page.$$eval('tr[data-key]', (rows) => rows.map((r) => [
  r.querySelector('[data-testid="state-key"]').textContent,
  Number(r.querySelector('[data-testid="state-size"]').dataset.value),
]));

/** The totals shown, by testid. */
const shownTotals = () => page.$$eval('[data-testid="state-totals"] [data-value]', (els) => Object.fromEntries(els.map((e) => [e.dataset.testid, e.dataset.value])));

async function checkListing(who) {
  const api = await getJson(API);
  check(JSON.stringify(api.entries.map((e) => e.key)) === JSON.stringify(ALL_KEYS), `${who}: the API lists the expected keys (${api.entries.map((e) => e.key)})`);
  await until(async () => (await page.locator('tr[data-key]').count()) === ALL_KEYS.length, `${who}: ${ALL_KEYS.length} rows`);
  const rows = await shownRows();
  check(JSON.stringify(rows) === JSON.stringify(api.entries.map((e) => [e.key, e.size])), `${who}: the table shows the API's keys and sizes in order`);
  check(rows.every(([, size]) => size > 0), `${who}: every size is positive`);
  const totals = await shownTotals();
  check(totals['state-store'] === 'st/count', `${who}: the store is st/count (${totals['state-store']})`);
  check(totals['state-keys'] === String(api.keys), `${who}: the totals show ${api.keys} keys (${totals['state-keys']})`);
  check(totals['state-bytes'] === String(api.bytes), `${who}: the totals show ${api.bytes} bytes (${totals['state-bytes']})`);
  check(totals['state-max-bytes'] === String(api.max_bytes), `${who}: the totals show max_bytes ${api.max_bytes}`);
  const revisions = await page.$$eval('tr[data-key] [data-testid="state-revision"]', (els) => els.map((e) => Number(e.textContent)));
  check(JSON.stringify(revisions) === JSON.stringify(api.entries.map((e) => e.revision)), `${who}: the revisions are the API's`);
  const expiry = await page.$$eval('tr[data-key] [data-testid="state-expires"]', (els) => els.map((e) => e.textContent));
  check(expiry.every((t) => t === 'never'), `${who}: no key expires`);
  // The markup key is text, not markup.
  check(await page.locator(`${testid('state-list')} b`).count() === 0, `${who}: a key's markup is not rendered`);
  check((await page.textContent(row(MARKUP))).includes('<b>blue</b>&'), `${who}: the markup key shows as text`);
}

async function run() {
  await page.goto(`${URL_BASE}/ui/`);
  await signIn(FULL, 'full');

  // ---- the overview links to the state of `count` only.
  await page.waitForSelector(testid('stage-state-st-count'));
  await page.waitForSelector(testid('stage-depth-st-relay'));
  check(await page.locator(testid('stage-state-st-relay')).count() === 0, 'overview: no state link on relay (no state:)');
  await page.click(testid('stage-state-st-count'));
  await until(async () => (await page.evaluate(() => location.hash)) === '#/state/st/count', 'the overview link opens #/state/st/count');

  // ---- full token: totals and keys as the API has them.
  await checkListing('full');
  check(await page.isHidden(testid('state-more')), 'no "more" when everything fits');
  await noBanner('on the state view');

  // ---- the prefix filter.
  await page.fill(testid('state-prefix'), 'count/');
  await page.click(testid('state-search-submit'));
  await until(async () => (await page.evaluate(() => location.hash)) === '#/state/st/count?prefix=count%2F', 'the prefix in the address');
  await until(async () => JSON.stringify((await shownRows()).map(([k]) => k)) === JSON.stringify([MARKUP, RED]), 'the two count/ keys');

  // ---- paging with `after`: three at a time.
  await go('#/state/st/count?limit=3');
  await until(async () => (await page.locator('tr[data-key]').count()) === 3, 'the first page of 3');
  check(JSON.stringify((await shownRows()).map(([k]) => k)) === JSON.stringify(ALL_KEYS.slice(0, 3)), 'the first page is the first 3 keys');
  check(await page.isVisible(testid('state-more')), '"more" shows when the API says more');
  await page.click(testid('state-more'));
  await until(async () => (await page.locator('tr[data-key]').count()) === 6, 'the second page appended');
  check(await page.isVisible(testid('state-more')), '"more" still shows after 6 of 7');
  await page.click(testid('state-more'));
  await until(async () => (await page.locator('tr[data-key]').count()) === 7, 'the third page appended');
  check(JSON.stringify((await shownRows()).map(([k]) => k)) === JSON.stringify(ALL_KEYS), 'the pages together are every key, in order, once');
  check(await page.isHidden(testid('state-more')), 'no "more" after the last page');

  // ---- values: text, for a plain key and the markup key.
  await go('#/state/st/count?prefix=count%2F');
  await until(async () => (await page.locator('tr[data-key]').count()) === 2, 'the count/ keys');
  await page.click(`${row(RED)} ${testid('state-show')}`);
  await until(async () => (await page.textContent(testid('state-value-key'))) === RED, 'the value of count/red');
  check((await page.textContent(testid('state-value'))) === '3', 'count/red is 3 (three inc)');
  check((await page.getAttribute(testid('state-value'), 'data-encoding')) === 'text', 'count/red is shown as text');
  const redApi = await getJson(keyPath(RED));
  check((await page.textContent(testid('state-value-revision'))) === String(redApi.revision), 'the value shows its revision');
  await page.click(`${row(MARKUP)} ${testid('state-show')}`);
  await until(async () => (await page.textContent(testid('state-value-key'))) === MARKUP, 'the value of the markup key');
  check((await page.textContent(testid('state-value'))) === '2', `${MARKUP} is 2 (two inc)`);
  check(await page.locator(`${testid('state-value-box')} b`).count() === 0, 'the markup key is not rendered in the value panel');
  await shot('state-value');

  // ---- delete: cancel leaves the key, confirm deletes it.
  await page.click(`${row(RED)} ${testid('state-delete')}`);
  await page.waitForSelector(`${testid('confirm')}[open]`);
  check((await page.textContent(testid('confirm-key'))) === RED, 'the dialog names count/red');
  await page.click(testid('confirm-cancel'));
  check((await getJson(keyPath(RED))).value === '3', 'cancelled: count/red is still 3');
  await page.click(`${row(MARKUP)} ${testid('state-delete')}`);
  await page.waitForSelector(`${testid('confirm')}[open]`);
  check((await page.textContent(testid('confirm-key'))) === MARKUP, 'the dialog names the markup key');
  await page.click(testid('confirm-ok'));
  await until(async () => (await page.textContent(testid('notice'))) === `Deleted ${MARKUP}.`, 'the delete notice');
  await until(async () => (await page.locator('tr[data-key]').count()) === 1, 'the deleted row gone');
  check(JSON.stringify((await shownRows()).map(([k]) => k)) === JSON.stringify([RED]), 'only count/red is left under count/');
  check(await page.isHidden(testid('state-value-box')), 'the deleted key\'s value is no longer shown');
  // Asked from here, not the page: a 404 in the page's log would be an error.
  const gone = await fetch(`${URL_BASE}${keyPath(MARKUP)}`, { headers: { Authorization: `Bearer ${FULL}` } });
  check(gone.status === 404, `the API no longer has the markup key (${gone.status} ${await gone.text()})`);
  const after = await getJson(API);
  check(after.keys === ALL_KEYS.length - 1, `the store counts ${ALL_KEYS.length - 1} keys (${after.keys})`);
  await until(async () => (await shownTotals())['state-keys'] === String(ALL_KEYS.length - 1), 'the totals follow the delete (polled)');
  check(valueRequests.filter((r) => r.startsWith('DELETE')).length === 1, `one DELETE was sent (${valueRequests})`);
  await noBanner('after the delete');

  // ---- the stage view links to the state only for a stage that keeps it.
  await go('#/stage/st/count');
  await until(async () => page.isVisible(testid('stage-state-link')), 'the stage view\'s state link');
  check((await page.getAttribute(testid('stage-state-link'), 'href')) === '#/state/st/count', 'the stage link points at #/state/st/count');
  await go('#/stage/st/relay');
  await until(async () => (await page.textContent(testid('stage-config'))).includes('"subscribe"'), 'relay\'s config');
  check(await page.isHidden(testid('stage-state-link')), 'relay (no state:) has no state link');

  // ---- the read token: keys and sizes, never a value, no delete.
  await page.click(testid('sign-out'));
  await page.waitForSelector(testid('signin-form'));
  await signIn(READ, 'read');
  const before = valueRequests.length;
  await go('#/state/st/count');
  const readKeys = ALL_KEYS.filter((k) => k !== MARKUP);
  await until(async () => (await page.locator('tr[data-key]').count()) === readKeys.length, 'read: the rows');
  const api = await getJson(API);
  const rows = await shownRows();
  check(JSON.stringify(rows) === JSON.stringify(api.entries.map((e) => [e.key, e.size])), 'read: the table shows the API\'s keys and sizes');
  check(JSON.stringify(rows.map(([k]) => k)) === JSON.stringify(readKeys), 'read: the keys left after the delete');
  check((await shownTotals())['state-keys'] === String(api.keys), 'read: the totals');
  check(await page.locator(testid('state-show')).count() === 0, 'read: no value button');
  check(await page.locator(testid('state-delete')).count() === 0, 'read: no delete button');
  check(await page.locator(testid('state-value')).count() === 0, 'read: no value shown');
  check(await page.isVisible(testid('state-read-only')), 'read: the page says values need the full token');
  check(valueRequests.length === before, `read: the page asked for no value (${valueRequests.slice(before)})`);
  await noBanner('on the read state view');
  // The full session's delete notice fades after 8 s; the screenshot waits for it.
  await until(async () => page.isHidden(testid('notice')), 'the earlier notice gone');
  await shot('state-read');
  // The server refuses it too, with its message.
  const refused = await pageFetch('GET', keyPath(RED));
  check(refused.status === 403, `read: GET a value is 403 (${refused.status})`);
  check(refused.json && /read token/.test(refused.json.error), `read: the refusal says why (${refused.text})`);
  check(!refused.text.includes('"value"'), 'read: the refusal carries no value');
  const readCsrf = (await getJson('/ui/session')).csrf;
  const del = await pageFetch('DELETE', keyPath(RED), { csrf: readCsrf });
  check(del.status === 403, `read: DELETE is 403 (${del.status})`);

  await noPageProblems();
}

await runAndExit('state.mjs', 'sluice-console-state-failure.png', run);
