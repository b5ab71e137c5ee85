// What the console's browser tests (console.mjs, state.mjs) share: a real
// Chromium (playwright-core) on one page, the page's problems collected from
// its first load, fetch from the page, sign-in, polling, screenshots, and the
// exit: 0 when every check holds; otherwise what failed, a screenshot of the
// page and 1. Each script keeps its own checks; this module holds none of its
// own but the last, that the page logged no problem.
//
// Environment (read here): SLUICE_CHROMIUM, SLUICE_SCREENSHOT_DIR.

import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

/** `name` from the environment; unset or empty is an error, never a default. */
export const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};

/** Generous limits for things to appear: waits, not timing assertions. */
export const WAIT = 30000;

export function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok - ${what}`);
}

export const testid = (id) => `[data-testid="${id}"]`;

/**
 * Polls `fn` until it returns a truthy value, and returns that. A throw
 * counts as "not yet" (the page may be mid-render); the last answer or error
 * is in the message when it gives up.
 */
export async function until(fn, what, timeout = WAIT) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what} (last: ${last && last.stack ? last.stack : JSON.stringify(last)})`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * Launches Chromium on a fresh page and returns it with the helpers bound to
 * it. `tolerate` matches the console messages the calling script causes on
 * purpose (each script's differ, and says why); every other console error or
 * warning, page error and CSP violation fails `noPageProblems`.
 */
export async function openConsole({ tolerate }) {
  if (!(tolerate instanceof RegExp)) throw new Error('openConsole: `tolerate` must be a RegExp (what the script causes on purpose)');
  const shots = env('SLUICE_SCREENSHOT_DIR');
  mkdirSync(shots, { recursive: true });

  const browser = await chromium.launch({ executablePath: env('SLUICE_CHROMIUM'), args: ['--no-sandbox'] });
  const context = await browser.newContext({ viewport: { width: 1360, height: 860 } });
  const page = await context.newPage();

  // Everything the page logs at error or warning level, page errors, and CSP
  // violations (an init script registers for them before the app runs).
  const problems = [];
  page.on('console', (msg) => {
    if (msg.type() !== 'error' && msg.type() !== 'warning') return;
    if (tolerate.test(msg.text())) return;
    problems.push(`console ${msg.type()}: ${msg.text()}`);
  });
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  await context.addInitScript(() => {
    window.__cspViolations = [];
    document.addEventListener('securitypolicyviolation', (e) => {
      window.__cspViolations.push(`${e.violatedDirective}: ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
    });
  });

  /** fetch from the page: with its cookie, as the app would. */
  async function pageFetch(method, path, { body, csrf, contentType } = {}) {
    return page.evaluate(async ({ method, path, body, csrf, contentType }) => {
      const headers = {};
      if (csrf !== undefined) headers['X-Sluice-CSRF'] = csrf;
      if (body !== undefined) headers['Content-Type'] = contentType || 'application/json';
      const r = await fetch(path, {
        method, headers, credentials: 'same-origin',
        body: body === undefined ? undefined : (typeof body === 'string' ? body : JSON.stringify(body)),
      });
      const text = await r.text();
      let json = null;
      try { json = JSON.parse(text); } catch { /* not JSON */ }
      return { status: r.status, json, text };
    }, { method, path, body, csrf, contentType });
  }

  async function getJson(path) {
    const r = await pageFetch('GET', path);
    if (r.status !== 200) throw new Error(`GET ${path}: ${r.status} ${r.text}`);
    return r.json;
  }

  async function shot(name) {
    await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
    console.log(`screenshot ${name}.png`);
  }

  async function go(hash) {
    await page.evaluate((h) => { location.hash = h; }, hash);
  }

  async function bannerText() {
    return page.evaluate(() => (document.getElementById('banner').hidden ? '' : document.getElementById('banner-text').textContent));
  }

  async function noBanner(where) {
    const text = await bannerText();
    check(text === '', `no error banner ${where}${text ? ` (it says: ${text})` : ''}`);
  }

  async function signIn(token, role) {
    await page.waitForSelector(testid('signin-token'));
    await page.fill(testid('signin-token'), token);
    await page.click(testid('signin-submit'));
    await page.waitForSelector(`${testid('role')}:has-text("${role}")`);
    check(true, `signed in as ${role}`);
  }

  /** The last checks of every script: no CSP violation, nothing logged but what it tolerates. */
  async function noPageProblems() {
    const violations = await page.evaluate(() => window.__cspViolations);
    check(violations.length === 0, `no CSP violations (${violations.join('; ')})`);
    check(problems.length === 0, `no console errors or page errors (${problems.join(' | ')})`);
  }

  /**
   * Runs `checks`, closes the browser and exits: 0 when they all held;
   * otherwise 1, after printing the error, the page's problems so far, its
   * banner, and a screenshot of the page at $TMPDIR/`failureShot`.
   */
  async function runAndExit(script, failureShot, checks) {
    let failed = false;
    try {
      await checks();
      console.log(`${script}: every check passed`);
    } catch (err) {
      failed = true;
      console.error(err && err.stack ? err.stack : err);
      if (problems.length) console.error(`page problems so far:\n${problems.join('\n')}`);
      try {
        console.error(`banner: ${await bannerText()}`);
        const where = join(tmpdir(), failureShot);
        await page.screenshot({ path: where, fullPage: true });
        console.error(`screenshot ${where}`);
      } catch { /* the page may be gone */ }
    } finally {
      await browser.close();
    }
    process.exit(failed ? 1 : 0);
  }

  return { browser, context, page, pageFetch, getJson, shot, go, bannerText, noBanner, signIn, noPageProblems, runAndExit };
}
