// Sluice web console: a single page over the admin API (/v1/...).
//
// No framework, no build step, no external assets: the server's CSP allows
// only this file's own origin, no inline script or style, no eval. Routes
// live in the hash (#/, #/stage/P/S, #/dlq/P/S, #/dlq/P/S/SEQ, #/state/P/S,
// #/topic/T); each view polls what it shows and stops when the route
// changes.
'use strict';

/** How often the overview and stage views poll /v1/status (ms). */
const POLL_MS = 2000;
/** How often the stage view reloads its 15-minute history (ms). */
const HISTORY_MS = 10000;
/** The longest long-poll of the topic tail (ms); the server allows 30 s. */
const TAIL_WAIT_MS = 20000;
/** Messages the topic tail keeps on screen. */
const TAIL_KEEP = 200;
/** Failure kinds the DLQ search offers (the server's FailureKind names). */
const KINDS = ['retry', 'rejected', 'trap', 'timeout', 'out-of-memory', 'output-too-large',
  'undeclared-topic', 'claim-missing', 'publish-failed', 'dedup-conflict', 'unavailable'];
/** Colours of the failure kinds in a stage's graph. */
const PALETTE = ['#b42318', '#9a6700', '#6f42c1', '#0f7b6c', '#c2410c', '#1d5fa8', '#86198f',
  '#4d7c0f', '#be185d', '#0e7490', '#57534e'];

const session = { role: null, csrf: '' };
/** The current view's lifetime: bumped on every route change. */
let generation = 0;
/** Timers and abort controllers of the current view. */
let cleanups = [];

// ---------------------------------------------------------------- DOM helpers

/**
 * Creates an element. `attrs`: `class`, `text`, `testid` (data-testid),
 * `on` ({event: handler}), `dataset`, booleans, and plain attributes.
 */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

/** An SVG element with presentation attributes. */
function s(tag, attrs, ...children) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'text') el.textContent = String(value);
    else if (name === 'testid') el.setAttribute('data-testid', value);
    else if (name === 'on') for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
    else if (name === 'dataset') Object.assign(el.dataset, value);
    else if (value === true) el.setAttribute(name, '');
    else el.setAttribute(name, String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

const $ = (id) => document.getElementById(id);

/** Replaces the main view's content. */
function show(...children) {
  const view = $('view');
  view.replaceChildren();
  append(view, children);
}

// ------------------------------------------------------------------ formatting

function fmtInt(n) {
  return n === null || n === undefined ? '–' : Number(n).toLocaleString('en-US');
}

function fmtRate(x) {
  if (x === null || x === undefined) return '–';
  const digits = x >= 100 ? 0 : x >= 10 ? 1 : 2;
  return `${x.toFixed(digits)}/s`;
}

function fmtSeconds(sec) {
  if (sec === null || sec === undefined) return '–';
  if (sec < 1) return `${Math.round(sec * 1000)} ms`;
  if (sec < 60) return `${sec.toFixed(1)} s`;
  if (sec < 3600) return `${Math.floor(sec / 60)}m ${Math.floor(sec % 60)}s`;
  if (sec < 86400) return `${Math.floor(sec / 3600)}h ${Math.floor((sec % 3600) / 60)}m`;
  return `${Math.floor(sec / 86400)}d ${Math.floor((sec % 86400) / 3600)}h`;
}

function fmtTime(ms) {
  if (ms === null || ms === undefined) return '–';
  return new Date(ms).toISOString().replace('T', ' ').replace('Z', ' UTC');
}

function pathPart(s) {
  return encodeURIComponent(s);
}

// ------------------------------------------------------------------------ API

class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

/**
 * Calls the admin API with the session cookie; writes carry the CSRF token.
 * Throws ApiError with the server's `error` text on any non-2xx answer.
 */
async function api(method, path, body, signal) {
  const headers = { Accept: 'application/json' };
  if (method !== 'GET' && session.csrf) headers['X-Sluice-CSRF'] = session.csrf;
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store', signal };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    const said = data && typeof data === 'object' && data.error ? data.error : (text || response.statusText);
    throw new ApiError(response.status, `${method} ${path}: ${response.status} ${said}`, data);
  }
  return data;
}

/** Shows an API failure; a lost session (401) goes back to the sign-in page. */
function fail(err) {
  if (err && err.name === 'AbortError') return;
  if (err instanceof ApiError && err.status === 401 && !String(err.message).includes('/ui/session')) {
    session.role = null;
    session.csrf = '';
    renderHeader();
    signIn('Your session has ended: sign in again.');
    return;
  }
  banner(err && err.message ? err.message : String(err));
}

function banner(text) {
  $('banner-text').textContent = text;
  $('banner').hidden = false;
}

function clearBanner() {
  $('banner').hidden = true;
  $('banner-text').textContent = '';
}

let noticeTimer = null;
function notice(text) {
  $('notice-text').textContent = text;
  $('notice').hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { $('notice').hidden = true; }, 8000);
}

const canWrite = () => session.role === 'full' || session.role === 'open';

// ---------------------------------------------------------------- confirmation

/**
 * Asks in the page's own dialog; resolves true when confirmed.
 * `count` is shown in its own element so a test can read it.
 */
function confirmDialog(title, text, okLabel) {
  const dialog = $('confirm');
  $('confirm-title').textContent = title;
  $('confirm-text').replaceChildren();
  append($('confirm-text'), [text]);
  $('confirm-ok').textContent = okLabel || 'Confirm';
  return new Promise((resolve) => {
    const done = (answer) => {
      $('confirm-ok').removeEventListener('click', ok);
      $('confirm-cancel').removeEventListener('click', cancel);
      dialog.removeEventListener('cancel', cancel);
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    const ok = () => done(true);
    const cancel = (event) => {
      if (event) event.preventDefault();
      done(false);
    };
    $('confirm-ok').addEventListener('click', ok);
    $('confirm-cancel').addEventListener('click', cancel);
    dialog.addEventListener('cancel', cancel);
    dialog.showModal();
  });
}

/** "<count> message(s)" with the number in a testable element. */
function countText(n, what) {
  return [h('b', { testid: 'confirm-count', text: String(n) }), ` ${what}${n === 1 ? '' : 's'}`];
}

// ---------------------------------------------------------------------- routes

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const [path, query] = raw.split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  return { parts, query: new URLSearchParams(query || '') };
}

function crumbs(...items) {
  const nav = $('crumbs');
  nav.replaceChildren();
  items.forEach((item, i) => {
    if (i > 0) nav.append(h('span', { class: 'sep', text: '/' }));
    nav.append(item.href ? h('a', { href: item.href, text: item.text }) : h('span', { text: item.text }));
  });
}

function stopView() {
  generation += 1;
  for (const cleanup of cleanups) cleanup();
  cleanups = [];
}

function every(ms, fn) {
  const timer = setInterval(fn, ms);
  cleanups.push(() => clearInterval(timer));
}

function route() {
  stopView();
  if (!session.role) {
    signIn();
    return;
  }
  const { parts, query } = parseHash();
  const [view, ...rest] = parts;
  if (!view) overview();
  else if (view === 'stage' && rest.length === 2) stageView(rest[0], rest[1]);
  else if (view === 'dlq' && rest.length === 2) dlqView(rest[0], rest[1], query);
  else if (view === 'dlq' && rest.length === 3) dlqEntryView(rest[0], rest[1], rest[2]);
  else if (view === 'state' && rest.length === 2) stateView(rest[0], rest[1], query);
  else if (view === 'topic' && rest.length === 1) topicView(rest[0]);
  else {
    crumbs({ text: 'not found' });
    show(h('p', { text: 'No such page. ' }, h('a', { href: '#/', text: 'Back to the overview' })));
  }
}

// --------------------------------------------------------------------- session

function renderHeader() {
  const who = $('who');
  who.hidden = !session.role;
  who.className = `who role-${session.role || 'none'}`;
  who.textContent = session.role === 'open' ? 'open (no tokens)' : session.role ? `role: ${session.role}` : '';
  $('sign-out').hidden = !session.role || session.role === 'open';
}

function signIn(message) {
  stopView();
  crumbs({ text: 'sign in' });
  const input = h('input', {
    type: 'password', id: 'token', name: 'token', autocomplete: 'current-password',
    required: true, testid: 'signin-token', placeholder: 'admin token',
  });
  const form = h('form', { testid: 'signin-form', on: { submit: submit } },
    h('label', {}, 'Token (full-access or read-only)', input),
    h('button', { type: 'submit', testid: 'signin-submit', text: 'Sign in' }));
  async function submit(event) {
    event.preventDefault();
    clearBanner();
    try {
      const answer = await api('POST', '/ui/session', { token: input.value });
      input.value = '';
      session.role = answer.role;
      session.csrf = answer.csrf || '';
      renderHeader();
      route();
    } catch (err) {
      banner(err instanceof ApiError && err.status === 401
        ? `Sign-in refused: ${err.body && err.body.error ? err.body.error : 'wrong token'}`
        : err.message);
    }
  }
  show(h('div', { class: 'signin panel' },
    h('h1', { text: 'Sign in to Sluice' }),
    message ? h('p', { class: 'muted', text: message }) : null,
    h('p', { class: 'muted', text: 'Use the daemon\'s admin token (SLUICE_ADMIN_TOKEN) for full access, '
      + 'or its read token (SLUICE_ADMIN_READ_TOKEN) to look without changing anything.' }),
    form));
  input.focus();
}

async function signOut() {
  try {
    await api('DELETE', '/ui/session');
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) {
      fail(err);
      return;
    }
  }
  session.role = null;
  session.csrf = '';
  renderHeader();
  clearBanner();
  location.hash = '#/';
  signIn('Signed out.');
}

async function boot() {
  $('banner-close').addEventListener('click', clearBanner);
  $('sign-out').addEventListener('click', signOut);
  window.addEventListener('hashchange', () => {
    clearBanner();
    route();
  });
  try {
    const answer = await api('GET', '/ui/session');
    session.role = answer.role;
    session.csrf = answer.csrf || '';
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) banner(err.message);
  }
  renderHeader();
  route();
}

// -------------------------------------------------------------------- overview

/**
 * Stage configs by "P/S", fetched once per overview (outputs come from
 * them). A stage whose config cannot be read is drawn without its outputs,
 * and the error is shown; it is asked again at the next poll.
 */
async function stageConfigs(stages, known) {
  const missing = stages.filter((st) => !known.has(`${st.pipeline}/${st.stage}`));
  await Promise.all(missing.map(async (st) => {
    try {
      const detail = await api('GET', `/v1/stages/${pathPart(st.pipeline)}/${pathPart(st.stage)}`);
      known.set(`${st.pipeline}/${st.stage}`, detail);
    } catch (err) {
      fail(err);
    }
  }));
  return known;
}

/** The topics a stage reads, from its status (lanes) or its config. */
function inputsOf(st) {
  if (st.lanes && st.lanes.length) return st.lanes.map((l) => l.topic);
  return st.topic ? [st.topic] : [];
}

/** The topics a stage publishes to, from its config. */
function outputsOf(detail) {
  const publish = detail && detail.config && detail.config.publish;
  if (!Array.isArray(publish)) return [];
  return publish.map((p) => (typeof p === 'string' ? p : p && p.topic)).filter(Boolean);
}

/** Fixed concurrency from a stage's config (a number, or {max}). */
function configuredConcurrency(detail) {
  const c = detail && detail.config && detail.config.concurrency;
  if (typeof c === 'number') return c;
  if (c && typeof c === 'object' && typeof c.max === 'number') return c.max;
  return null;
}

/**
 * Lays a pipeline out in columns: sources, then alternately topics and
 * stages by their distance from the start, so edges run left to right.
 */
function layout(pipeline, sources, stages, details) {
  const nodes = new Map();
  const edges = [];
  const node = (id, kind, data) => {
    if (!nodes.has(id)) nodes.set(id, { id, kind, data, layer: 0 });
    return nodes.get(id);
  };
  for (const src of sources) {
    node(`source:${src.source}`, 'source', src);
    node(`topic:${src.topic}`, 'topic', { topic: src.topic });
    edges.push([`source:${src.source}`, `topic:${src.topic}`]);
  }
  for (const st of stages) {
    const id = `stage:${st.stage}`;
    node(id, st.kind && st.kind.startsWith('sink') ? 'sink' : 'stage', st);
    for (const t of inputsOf(st)) {
      node(`topic:${t}`, 'topic', { topic: t });
      edges.push([`topic:${t}`, id]);
    }
    for (const t of outputsOf(details.get(`${pipeline}/${st.stage}`))) {
      node(`topic:${t}`, 'topic', { topic: t });
      edges.push([id, `topic:${t}`]);
    }
  }
  // Longest path from the start; a cycle stops after as many rounds as nodes.
  for (let round = 0; round < nodes.size; round += 1) {
    let moved = false;
    for (const [from, to] of edges) {
      const a = nodes.get(from);
      const b = nodes.get(to);
      if (b.layer < a.layer + 1) {
        b.layer = a.layer + 1;
        moved = true;
      }
    }
    if (!moved) break;
  }
  // Topics nobody produces into sit in the first topic column.
  const columns = [];
  for (const n of nodes.values()) {
    let layer = n.layer;
    if (n.kind === 'topic' && layer === 0 && sources.length) layer = 1;
    (columns[layer] = columns[layer] || []).push(n);
  }
  return { columns: columns.filter(Boolean), edges };
}

function stat(label, testid, value, text, cls) {
  return [h('dt', { text: label }),
    h('dd', { testid, class: cls, dataset: { value: value === null || value === undefined ? '' : String(value) }, text })];
}

function stageNode(pipeline, st, detail) {
  const key = `${pipeline}-${st.stage}`;
  const sink = st.kind && st.kind.startsWith('sink');
  const limit = st.concurrency_limit ?? configuredConcurrency(detail);
  const dlqLink = h('a', { href: `#/dlq/${pathPart(pipeline)}/${pathPart(st.stage)}` });
  dlqLink.append(h('span', {
    testid: `stage-dlq-${key}`, class: st.dlq_depth > 0 ? 'dlq-nonzero' : null,
    dataset: { value: String(st.dlq_depth) }, text: fmtInt(st.dlq_depth),
  }));
  const classes = ['node', sink ? 'sink' : 'stage'];
  if (st.paused) classes.push('paused');
  if (st.up === false) classes.push('down');
  return h('div', { class: classes.join(' '), testid: `stage-${key}`, dataset: { node: `stage:${st.stage}` } },
    h('div', { class: 'name' },
      h('a', { href: `#/stage/${pathPart(pipeline)}/${pathPart(st.stage)}`, text: st.stage }),
      sink ? h('span', { class: 'badge', text: st.kind }) : null,
      st.up === undefined || st.up === null ? null
        : h('span', { class: `badge ${st.up ? 'up' : 'down'}`, testid: `stage-up-${key}`, text: st.up ? 'up' : 'down' }),
      st.paused ? h('span', { class: 'badge paused', testid: `stage-paused-${key}`, text: 'paused' }) : null),
    h('dl', {},
      stat('rate', `stage-rate-${key}`, st.processed_per_sec, fmtRate(st.processed_per_sec)),
      stat('backlog', `stage-depth-${key}`, st.depth, fmtInt(st.depth)),
      stat('oldest', `stage-oldest-${key}`, st.oldest_age_seconds, fmtSeconds(st.oldest_age_seconds)),
      stat('in flight', `stage-inflight-${key}`, st.in_flight,
        limit === null ? fmtInt(st.in_flight) : `${fmtInt(st.in_flight)} / ${fmtInt(limit)}`
          + (st.concurrency_max ? ` (max ${st.concurrency_max})` : '')),
      st.delayed ? stat('delayed', `stage-delayed-${key}`, st.delayed, fmtInt(st.delayed)) : null,
      st.open_files ? stat('open files', `stage-open-files-${key}`, st.open_files.count,
        st.open_files.count ? `${fmtInt(st.open_files.count)} (oldest ${fmtSeconds(st.open_files.oldest_seconds)})` : '0') : null,
      [h('dt', { text: 'DLQ' }), h('dd', {}, dlqLink)],
      detail && detail.state_store ? [h('dt', { text: 'state' }), h('dd', {},
        h('a', { href: `#/state/${pathPart(pipeline)}/${pathPart(st.stage)}`, testid: `stage-state-${key}`, title: `state store ${detail.state_store}`, text: 'keys' }))] : null));
}

function sourceNode(pipeline, src) {
  const key = `${pipeline}-${src.source}`;
  return h('div', { class: `node source${src.up ? '' : ' down'}`, testid: `source-${key}`, dataset: { node: `source:${src.source}` } },
    h('div', { class: 'name' }, src.source, h('span', { class: 'badge', text: src.kind }),
      h('span', { class: `badge ${src.up ? 'up' : 'down'}`, testid: `source-up-${key}`, text: src.up ? 'up' : 'down' })),
    h('div', { class: 'muted mono', text: src.upstream }),
    h('dl', {},
      stat('read', `source-read-${key}`, src.read_total, fmtInt(src.read_total)),
      stat('lag', `source-lag-${key}`, src.lag, fmtInt(src.lag)),
      [h('dt', { text: 'DLQ' }), h('dd', {}, h('a', { href: `#/dlq/${pathPart(pipeline)}/${pathPart(src.source)}` },
        h('span', { testid: `source-dlq-${key}`, class: src.dlq_depth > 0 ? 'dlq-nonzero' : null,
          dataset: { value: String(src.dlq_depth) }, text: fmtInt(src.dlq_depth) })))]));
}

function topicNode(name, topics) {
  const t = topics.get(name);
  return h('div', { class: 'node topic', testid: `topic-${name}`, dataset: { node: `topic:${name}` } },
    h('div', { class: 'name' }, h('a', { href: `#/topic/${pathPart(name)}`, text: name })),
    t ? h('dl', {}, stat('stored', `topic-depth-${name}`, t.depth, fmtInt(t.depth))) : null);
}

/** Draws the edges of a graph over its columns, from measured boxes. */
function drawEdges(graph, edges) {
  const old = graph.querySelector('svg.edges');
  if (old) old.remove();
  const box = graph.getBoundingClientRect();
  const svg = s('svg', { class: 'edges', width: graph.scrollWidth, height: graph.scrollHeight });
  const find = (id) => graph.querySelector(`[data-node="${CSS.escape(id)}"]`);
  for (const [from, to] of edges) {
    const a = find(from);
    const b = find(to);
    if (!a || !b) continue;
    const ra = a.getBoundingClientRect();
    const rb = b.getBoundingClientRect();
    const x1 = ra.right - box.left + graph.scrollLeft;
    const y1 = ra.top + ra.height / 2 - box.top;
    const x2 = rb.left - box.left + graph.scrollLeft;
    const y2 = rb.top + rb.height / 2 - box.top;
    const mid = (x1 + x2) / 2;
    svg.append(s('path', {
      d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2 - 4},${y2}`,
      fill: 'none', stroke: '#8a97a5', 'stroke-width': 1.5,
    }));
    svg.append(s('path', { d: `M${x2 - 6},${y2 - 4} L${x2},${y2} L${x2 - 6},${y2 + 4} Z`, fill: '#8a97a5' }));
  }
  graph.prepend(svg);
}

function overview() {
  crumbs({ text: 'overview' });
  const gen = generation;
  const details = new Map();
  let renders = 0;
  let busy = false;
  const container = h('div', { testid: 'overview' });
  show(h('h1', { text: 'Pipelines' }),
    h('p', { class: 'muted', text: `Sources → topics → stages → sinks; refreshed every ${POLL_MS / 1000} s.` }),
    container);
  const graphs = [];
  const redraw = () => graphs.forEach(([g, e]) => drawEdges(g, e));
  window.addEventListener('resize', redraw);
  cleanups.push(() => window.removeEventListener('resize', redraw));

  async function poll() {
    if (busy) return;
    busy = true;
    try {
      const [status, sources, topicList] = await Promise.all([
        api('GET', '/v1/status'), api('GET', '/v1/sources'), api('GET', '/v1/topics')]);
      await stageConfigs(status, details);
      if (gen !== generation) return;
      const topics = new Map(topicList.map((t) => [t.topic, t]));
      const pipelines = [...new Set([...status.map((x) => x.pipeline), ...sources.map((x) => x.pipeline)])].sort();
      container.replaceChildren();
      graphs.length = 0;
      if (!pipelines.length) container.append(h('p', { class: 'muted', text: 'No pipelines are loaded.' }));
      for (const p of pipelines) {
        const stages = status.filter((x) => x.pipeline === p);
        const srcs = sources.filter((x) => x.pipeline === p);
        const { columns, edges } = layout(p, srcs, stages, details);
        const graph = h('div', { class: 'graph', testid: `pipeline-${p}` });
        for (const column of columns) {
          const col = h('div', { class: 'column' });
          for (const n of column) {
            if (n.kind === 'source') col.append(sourceNode(p, n.data));
            else if (n.kind === 'topic') col.append(topicNode(n.data.topic, topics));
            else col.append(stageNode(p, n.data, details.get(`${p}/${n.data.stage}`)));
          }
          graph.append(col);
        }
        container.append(h('h2', { class: 'pipeline-name', text: `pipeline ${p}` }), graph);
        graphs.push([graph, edges]);
      }
      redraw();
      renders += 1;
      container.dataset.renders = String(renders);
    } catch (err) {
      if (gen === generation) fail(err);
    } finally {
      busy = false;
    }
  }
  poll();
  every(POLL_MS, poll);
}

// ----------------------------------------------------------------------- stage

const CHART_W = 560;
const CHART_H = 150;
const PAD = { l: 46, r: 8, t: 10, b: 20 };

/**
 * A line chart of `series` ([{name, color, values: [[at_ms, y|null]]}])
 * over the 15 minutes up to `now`.
 */
function lineChart(title, testid, series, now, unit, formatY, stacked) {
  const from = now - 15 * 60 * 1000;
  const w = CHART_W - PAD.l - PAD.r;
  const hgt = CHART_H - PAD.t - PAD.b;
  let max = 0;
  for (const ser of series) for (const [, y] of ser.values) if (y !== null && y > max) max = y;
  if (stacked) {
    const sums = new Map();
    for (const ser of series) for (const [at, y] of ser.values) sums.set(at, (sums.get(at) || 0) + (y || 0));
    max = Math.max(0, ...sums.values());
  }
  if (max <= 0) max = 1;
  const x = (at) => PAD.l + ((at - from) / (now - from)) * w;
  const y = (v) => PAD.t + hgt - (v / max) * hgt;
  const svg = s('svg', { viewBox: `0 0 ${CHART_W} ${CHART_H}`, role: 'img', 'aria-label': title });
  for (const frac of [0, 0.5, 1]) {
    const yy = PAD.t + hgt - frac * hgt;
    svg.append(s('line', { x1: PAD.l, x2: PAD.l + w, y1: yy, y2: yy, stroke: '#e3e7eb' }));
    svg.append(s('text', { x: PAD.l - 4, y: yy + 3, 'text-anchor': 'end', text: formatY(max * frac) }));
  }
  for (const [label, at] of [['-15m', from], ['-10m', from + 5 * 60000], ['-5m', from + 10 * 60000], ['now', now]]) {
    svg.append(s('text', { x: x(at), y: CHART_H - 5, 'text-anchor': 'middle', text: label }));
  }
  if (stacked) {
    // Bars per interval, stacked by kind.
    const base = new Map();
    const barW = Math.max(2, (w / 90) - 1);
    for (const ser of series) {
      for (const [at, v] of ser.values) {
        if (!v) continue;
        const below = base.get(at) || 0;
        base.set(at, below + v);
        svg.append(s('rect', { x: x(at) - barW, y: y(below + v), width: barW, height: y(below) - y(below + v), fill: ser.color }));
      }
    }
  } else {
    for (const ser of series) {
      let d = '';
      let pen = false;
      for (const [at, v] of ser.values) {
        if (v === null || v === undefined) {
          pen = false;
          continue;
        }
        d += `${pen ? 'L' : 'M'}${x(at).toFixed(1)},${y(v).toFixed(1)} `;
        pen = true;
      }
      if (d) svg.append(s('path', { d, fill: 'none', stroke: ser.color, 'stroke-width': 1.6 }));
    }
  }
  const legend = h('div', { class: 'legend' }, series.map((ser) => h('span', {},
    s('svg', { width: 10, height: 10 }, s('rect', { width: 10, height: 10, rx: 2, fill: ser.color })),
    ` ${ser.name}`)));
  const empty = series.every((ser) => ser.values.every(([, v]) => !v));
  return h('div', { class: 'panel chart', testid },
    h('h3', { text: `${title}${unit ? ` (${unit})` : ''}` }), svg,
    series.length ? legend : null,
    empty ? h('div', { class: 'muted', text: stacked ? 'No failures in the last 15 minutes.' : 'No data yet.' }) : null);
}

function stageView(pipeline, stage) {
  const gen = generation;
  const base = `/v1/stages/${pathPart(pipeline)}/${pathPart(stage)}`;
  crumbs({ text: 'overview', href: '#/' }, { text: pipeline }, { text: stage });
  const statsBox = h('div', { class: 'panel stats', testid: 'stage-stats' });
  const controls = h('div', { class: 'toolbar' });
  const charts = h('div', { class: 'charts', testid: 'stage-charts' });
  const config = h('pre', { testid: 'stage-config' }, 'Loading…');
  const kind = h('span', { class: 'badge' });
  show(h('h1', {}, `${pipeline} / ${stage} `, kind),
    controls, statsBox,
    h('h2', { text: 'Last 15 minutes' }), charts,
    h('h2', { text: 'Configuration as loaded' }), config);

  let paused = null;
  const pause = h('button', { type: 'button', testid: 'stage-pause', text: 'Pause', on: { click: () => setPaused(true) } });
  const resume = h('button', { type: 'button', testid: 'stage-resume', text: 'Resume', on: { click: () => setPaused(false) } });
  controls.append(h('a', { class: 'button', href: `#/dlq/${pathPart(pipeline)}/${pathPart(stage)}`, testid: 'stage-dlq-link', text: 'Dead letters' }));
  // Shown once the stage's detail says it keeps state (`state_store`).
  const stateLink = h('a', { class: 'button', href: `#/state/${pathPart(pipeline)}/${pathPart(stage)}`, testid: 'stage-state-link', text: 'State', hidden: true });
  controls.append(stateLink);
  if (canWrite()) controls.append(pause, resume);

  async function setPaused(on) {
    pause.disabled = true;
    resume.disabled = true;
    try {
      const answer = await api('POST', `${base}/${on ? 'pause' : 'resume'}`);
      notice(`${pipeline}/${stage} ${answer.paused ? 'paused' : 'resumed'}.`);
      await pollStatus();
    } catch (err) {
      fail(err);
    } finally {
      pause.disabled = paused === true;
      resume.disabled = paused === false;
    }
  }

  async function pollStatus() {
    try {
      const status = await api('GET', '/v1/status');
      if (gen !== generation) return;
      const st = status.find((x) => x.pipeline === pipeline && x.stage === stage);
      if (!st) {
        statsBox.replaceChildren(h('span', { class: 'muted', text: 'This stage is not running.' }));
        return;
      }
      paused = st.paused;
      pause.disabled = paused;
      resume.disabled = !paused;
      const item = (label, testid, text) => h('div', {}, h('b', { testid, text }), h('span', { text: label }));
      statsBox.replaceChildren(
        item('rate', 'stage-view-rate', fmtRate(st.processed_per_sec)),
        item('backlog', 'stage-view-depth', fmtInt(st.depth)),
        item('in flight', 'stage-view-inflight', fmtInt(st.in_flight)),
        item('oldest', 'stage-view-oldest', fmtSeconds(st.oldest_age_seconds)),
        item('processed', 'stage-view-total', fmtInt(st.processed_total)),
        item('dead letters', 'stage-view-dlq', fmtInt(st.dlq_depth)),
        item('state', 'stage-view-state', st.paused ? 'paused' : st.up === false ? 'down' : 'running'));
    } catch (err) {
      if (gen === generation) fail(err);
    }
  }

  async function pollHistory() {
    try {
      const detail = await api('GET', base);
      if (gen !== generation) return;
      kind.textContent = detail.kind;
      stateLink.hidden = !detail.state_store;
      stateLink.title = detail.state_store ? `state store ${detail.state_store}` : '';
      config.textContent = JSON.stringify(detail.config, null, 2);
      const points = (detail.history && detail.history.points) || [];
      const now = Date.now();
      // Failed attempts by kind: retried ones and the last attempt of each
      // dead letter (`failures`, kept by the daemon per interval).
      const kinds = [...new Set(points.flatMap((p) => Object.keys(p.failures || {})))].sort();
      const failureSeries = kinds.map((k, i) => ({
        name: k, color: PALETTE[i % PALETTE.length],
        values: points.map((p) => [p.at_ms, (p.failures || {})[k] || 0]),
      }));
      charts.replaceChildren(
        lineChart('Throughput', 'chart-rate', [{ name: 'processed/s', color: '#1d5fa8',
          values: points.map((p) => [p.at_ms, p.processed_per_sec]) }], now, 'messages/s', (v) => v.toFixed(v >= 10 ? 0 : 1)),
        lineChart('Latency', 'chart-latency', [
          { name: 'p50', color: '#0f7b6c', values: points.map((p) => [p.at_ms, p.p50_seconds]) },
          { name: 'p99', color: '#c2410c', values: points.map((p) => [p.at_ms, p.p99_seconds]) },
        ], now, 'seconds', (v) => fmtSeconds(v)),
        lineChart('Failures by kind', 'chart-failures', failureSeries, now,
          `per ${detail.history ? detail.history.interval_seconds : 10} s`, (v) => v.toFixed(0), true));
    } catch (err) {
      if (gen === generation) fail(err);
    }
  }
  pollStatus();
  pollHistory();
  every(POLL_MS, pollStatus);
  every(HISTORY_MS, pollHistory);
}

// ------------------------------------------------------------------------- DLQ

/** The search form's fields, as the list's query and as a JSON filter. */
const FILTER_FIELDS = ['kind', 'error', 'header', 'key', 'since', 'until'];

function filterFromQuery(query) {
  const filter = {};
  for (const name of FILTER_FIELDS) {
    const value = query.get(name);
    if (!value) continue;
    if (name === 'kind' || name === 'header') filter[name] = [value];
    else filter[name] = value;
  }
  return filter;
}

function dlqView(pipeline, stage, query) {
  const gen = generation;
  const base = `/v1/dlq/${pathPart(pipeline)}/${pathPart(stage)}`;
  crumbs({ text: 'overview', href: '#/' }, { text: pipeline },
    { text: stage, href: `#/stage/${pathPart(pipeline)}/${pathPart(stage)}` }, { text: 'dead letters' });
  const filter = filterFromQuery(query);
  const limit = query.get('limit') || '100';

  const inputs = {
    kind: h('select', { name: 'kind', testid: 'dlq-kind' },
      h('option', { value: '', text: 'any' }), KINDS.map((k) => h('option', { value: k, text: k }))),
    error: h('input', { name: 'error', class: 'mono', placeholder: 'text in the error', testid: 'dlq-error' }),
    header: h('input', { name: 'header', class: 'mono', placeholder: 'name=value', testid: 'dlq-header' }),
    key: h('input', { name: 'key', class: 'mono', placeholder: 'exact key', testid: 'dlq-key' }),
    since: h('input', { name: 'since', class: 'mono', placeholder: '1h or RFC 3339', testid: 'dlq-since' }),
    until: h('input', { name: 'until', class: 'mono', placeholder: '10m or RFC 3339', testid: 'dlq-until' }),
  };
  for (const name of FILTER_FIELDS) inputs[name].value = query.get(name) || '';
  const limitInput = h('input', { name: 'limit', type: 'number', min: 1, max: 1000, value: limit, testid: 'dlq-limit' });
  const form = h('form', { class: 'toolbar panel', testid: 'dlq-search', on: { submit: search } },
    FILTER_FIELDS.map((name) => h('label', {}, name, inputs[name])),
    h('label', {}, 'limit', limitInput),
    h('button', { type: 'submit', testid: 'dlq-search-submit', text: 'Search' }),
    h('button', { type: 'button', class: 'quiet', text: 'Clear', on: { click: () => { location.hash = `#/dlq/${pathPart(pipeline)}/${pathPart(stage)}`; } } }));

  function search(event) {
    event.preventDefault();
    const q = new URLSearchParams();
    for (const name of FILTER_FIELDS) if (inputs[name].value.trim()) q.set(name, inputs[name].value.trim());
    if (limitInput.value && limitInput.value !== '100') q.set('limit', limitInput.value);
    const target = `#/dlq/${pathPart(pipeline)}/${pathPart(stage)}${q.toString() ? `?${q}` : ''}`;
    if (location.hash === target) route();
    else location.hash = target;
  }

  const selected = new Set();
  const summary = h('p', { class: 'muted', testid: 'dlq-summary', text: 'Loading…' });
  const table = h('div', { testid: 'dlq-list' });
  const redriveSelected = h('button', { type: 'button', testid: 'dlq-redrive-selected', disabled: true,
    on: { click: () => redrive({ seq: [...selected].sort((a, b) => a - b) }, 'selected') } }, 'Redrive selected');
  const redriveMatching = h('button', { type: 'button', testid: 'dlq-redrive-matching',
    on: { click: () => redrive(filter, 'matching') } }, 'Redrive all matching');
  const purgeMatching = h('button', { type: 'button', class: 'danger', testid: 'dlq-purge-matching',
    on: { click: () => purge(filter) } }, 'Purge matching');
  const actions = canWrite() ? h('div', { class: 'toolbar', testid: 'dlq-actions' }, redriveSelected, redriveMatching, purgeMatching) : null;

  const updateSelection = () => {
    redriveSelected.disabled = selected.size === 0;
    redriveSelected.textContent = `Redrive selected (${selected.size})`;
  };

  show(h('h1', {}, `Dead letters of ${pipeline} / ${stage}`), form, actions, summary, table);

  async function load() {
    try {
      const q = new URLSearchParams(query);
      if (!q.get('limit')) q.set('limit', '100');
      const list = await api('GET', `${base}?${q}`);
      if (gen !== generation) return;
      selected.clear();
      updateSelection();
      const filtered = Object.keys(filter).length > 0;
      summary.textContent = `${list.entries.length} ${filtered ? 'matching ' : ''}entr${list.entries.length === 1 ? 'y' : 'ies'} shown`
        + ` of ${fmtInt(list.depth)} in ${list.topic}.`;
      if (!list.entries.length) {
        table.replaceChildren(h('p', { class: 'muted', text: filtered ? 'No entry matches.' : 'The dead-letter queue is empty.' }));
        return;
      }
      const all = h('input', { type: 'checkbox', testid: 'dlq-select-all', 'aria-label': 'Select all', hidden: !canWrite() });
      const boxes = [];
      all.addEventListener('change', () => {
        for (const [box, seq, row] of boxes) {
          box.checked = all.checked;
          if (all.checked) selected.add(seq);
          else selected.delete(seq);
          row.classList.toggle('selected', all.checked);
        }
        updateSelection();
      });
      const rows = list.entries.map((e) => {
        const box = h('input', { type: 'checkbox', testid: `dlq-select-${e.seq}`, 'aria-label': `Select ${e.seq}`, hidden: !canWrite() });
        const row = h('tr', { testid: `dlq-row-${e.seq}`, dataset: { seq: String(e.seq), id: e.id } },
          h('td', {}, box),
          h('td', { class: 'mono' }, h('a', { href: `#/dlq/${pathPart(pipeline)}/${pathPart(stage)}/${e.seq}`, testid: `dlq-open-${e.seq}`, text: String(e.seq) })),
          h('td', { class: 'mono', text: e.id }),
          h('td', { class: 'mono', text: e.kind || '–' }),
          h('td', { class: 'err', text: e.error || e.problem || '–' }),
          h('td', { class: 'mono', text: e.attempts ?? '–' }),
          h('td', { class: 'mono', text: fmtTime(e.last_failure) }),
          h('td', { class: 'mono', text: e.key ?? '–' }),
          h('td', { class: 'preview', title: e.payload_preview, text: e.payload_preview }));
        box.addEventListener('change', () => {
          if (box.checked) selected.add(e.seq);
          else selected.delete(e.seq);
          row.classList.toggle('selected', box.checked);
          updateSelection();
        });
        boxes.push([box, e.seq, row]);
        return row;
      });
      table.replaceChildren(h('table', {},
        h('thead', {}, h('tr', {}, h('th', {}, all), ['seq', 'id', 'kind', 'error', 'attempts', 'last failure', 'key', 'payload']
          .map((t) => h('th', { text: t })))),
        h('tbody', {}, rows)));
    } catch (err) {
      if (gen === generation) {
        summary.textContent = '';
        fail(err);
      }
    }
  }

  async function redrive(which, label) {
    try {
      const dry = await api('POST', `${base}/redrive`, { dry_run: true, filter: which });
      if (dry.redriven === 0) {
        notice(`Nothing to redrive: no ${label} entry can be redriven${dry.skipped ? ` (${dry.skipped} skipped)` : ''}.`);
        return;
      }
      const skipped = dry.skipped ? ` (${dry.skipped} more would be skipped: ${dry.skipped_entries.map((x) => x.reason).slice(0, 2).join('; ')})` : '';
      const ok = await confirmDialog('Redrive dead letters',
        ['Publish ', countText(dry.redriven, `${label} message`), ' back to the topic they failed from, and remove them from the DLQ?', skipped],
        'Redrive');
      if (!ok) return;
      const done = await api('POST', `${base}/redrive`, { dry_run: false, filter: which });
      notice(`Redriven: ${done.redriven} message${done.redriven === 1 ? '' : 's'}${done.skipped ? `, ${done.skipped} skipped` : ''}.`);
      await load();
    } catch (err) {
      fail(err);
    }
  }

  async function purge(which) {
    try {
      const dry = await api('POST', `${base}/purge`, { all: true, dry_run: true, filter: which });
      if (dry.purged === 0) {
        notice('Nothing to purge: no entry matches.');
        return;
      }
      const everything = Object.keys(which).length === 0;
      const ok = await confirmDialog('Purge dead letters',
        ['Delete ', countText(dry.purged, everything ? 'message (the whole DLQ)' : 'matching message'),
          ' for good? This cannot be undone.'], 'Purge');
      if (!ok) return;
      const done = await api('POST', `${base}/purge`, { all: true, dry_run: false, filter: which });
      notice(`Purged: ${done.purged} message${done.purged === 1 ? '' : 's'}.`);
      await load();
    } catch (err) {
      fail(err);
    }
  }

  updateSelection();
  load();
}

// ------------------------------------------------------------------- DLQ entry

function payloadBytes(detail) {
  if (detail.payload !== undefined && detail.payload !== null) return new TextEncoder().encode(detail.payload);
  if (detail.payload_base64) return Uint8Array.from(atob(detail.payload_base64), (c) => c.charCodeAt(0));
  return new Uint8Array();
}

function hexDump(bytes) {
  const lines = [];
  for (let off = 0; off < bytes.length; off += 16) {
    const row = bytes.subarray(off, off + 16);
    const hex = [...row].map((b) => b.toString(16).padStart(2, '0')).join(' ');
    const ascii = [...row].map((b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : '.')).join('');
    lines.push(`${off.toString(16).padStart(8, '0')}  ${hex.padEnd(47)}  ${ascii}`);
  }
  return lines.join('\n') || '(empty)';
}

function renderPayload(bytes, mode) {
  if (mode === 'hex') return hexDump(bytes);
  const text = new TextDecoder('utf-8', { fatal: false }).decode(bytes);
  if (mode === 'json') {
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch (err) {
      return `(not JSON: ${err.message})\n\n${text}`;
    }
  }
  return text;
}

function dlqEntryView(pipeline, stage, seq) {
  const gen = generation;
  const base = `/v1/dlq/${pathPart(pipeline)}/${pathPart(stage)}`;
  const listHref = `#/dlq/${pathPart(pipeline)}/${pathPart(stage)}`;
  crumbs({ text: 'overview', href: '#/' }, { text: pipeline },
    { text: stage, href: `#/stage/${pathPart(pipeline)}/${pathPart(stage)}` },
    { text: 'dead letters', href: listHref }, { text: seq });
  show(h('p', { class: 'muted', text: 'Loading…' }));
  (async () => {
    try {
      const d = await api('GET', `${base}/${pathPart(seq)}`);
      if (gen !== generation) return;
      const bytes = payloadBytes(d);
      let mode = 'text';
      try {
        JSON.parse(new TextDecoder().decode(bytes));
        mode = 'json';
      } catch {
        mode = d.payload_base64 ? 'hex' : 'text';
      }
      const pre = h('pre', { testid: 'payload', dataset: { mode } });
      const toggles = ['text', 'json', 'hex'].map((m) => h('button', {
        type: 'button', class: 'toggle', testid: `payload-${m}`, 'aria-pressed': String(m === mode), text: m === 'json' ? 'pretty JSON' : m,
        on: { click: () => setMode(m) },
      }));
      function setMode(m) {
        mode = m;
        pre.dataset.mode = m;
        pre.textContent = renderPayload(bytes, m);
        toggles.forEach((t, i) => t.setAttribute('aria-pressed', String(['text', 'json', 'hex'][i] === m)));
      }
      setMode(mode);
      const kv = (pairs) => h('dl', { class: 'kv' }, pairs.map(([k, v, testid]) => [h('dt', { text: k }), h('dd', { testid, text: v ?? '–' })]));
      const provenance = d.headers.filter(([n]) => n.toLowerCase().startsWith('sluice-'));
      const user = d.headers.filter(([n]) => !n.toLowerCase().startsWith('sluice-'));
      const headerTable = (rows, testid) => (rows.length
        ? h('table', { testid }, h('thead', {}, h('tr', {}, h('th', { text: 'name' }), h('th', { text: 'value' }))),
          h('tbody', {}, rows.map(([n, v]) => h('tr', {}, h('td', { class: 'mono', text: n }), h('td', { class: 'mono', text: v })))))
        : h('p', { class: 'muted', text: 'none' }));
      const write = canWrite() ? h('div', { class: 'toolbar' },
        h('button', { type: 'button', testid: 'entry-redrive', text: 'Redrive this message', on: { click: redriveOne } }),
        h('button', { type: 'button', class: 'danger', testid: 'entry-purge', text: 'Purge this message', on: { click: purgeOne } })) : null;
      async function redriveOne() {
        try {
          const dry = await api('POST', `${base}/redrive`, { dry_run: true, filter: { seq: [d.seq] } });
          if (!dry.redriven) {
            banner(`This message cannot be redriven: ${dry.skipped_entries.map((x) => x.reason).join('; ') || 'it is gone'}`);
            return;
          }
          if (!await confirmDialog('Redrive dead letter', ['Publish ', countText(dry.redriven, 'message'), ` (${d.id}) back to ${d.source_topic || 'its source topic'}?`], 'Redrive')) return;
          const done = await api('POST', `${base}/redrive`, { filter: { seq: [d.seq] } });
          notice(`Redriven: ${done.redriven}.`);
          location.hash = listHref;
        } catch (err) {
          fail(err);
        }
      }
      async function purgeOne() {
        try {
          const dry = await api('POST', `${base}/purge`, { all: true, dry_run: true, filter: { seq: [d.seq] } });
          if (!await confirmDialog('Purge dead letter', ['Delete ', countText(dry.purged, 'message'), ' for good?'], 'Purge')) return;
          const done = await api('POST', `${base}/purge`, { all: true, filter: { seq: [d.seq] } });
          notice(`Purged: ${done.purged}.`);
          location.hash = listHref;
        } catch (err) {
          fail(err);
        }
      }
      show(h('h1', {}, `Dead letter ${d.seq} of ${pipeline} / ${stage}`), write,
        h('div', { class: 'panel', testid: 'entry-summary' }, kv([
          ['id', d.id, 'entry-id'], ['kind', d.kind, 'entry-kind'], ['error', d.error, 'entry-error'],
          ['attempts', d.attempts === null || d.attempts === undefined ? null : String(d.attempts), 'entry-attempts'],
          ['first failure', fmtTime(d.first_failure)], ['last failure', fmtTime(d.last_failure)],
          ['key', d.key, 'entry-key'], ['trace id', d.trace_id, 'entry-trace'],
          ['from', d.source_topic ? `${d.source_topic} @ ${d.source_seq ?? '?'}` : null, 'entry-source'],
          ['payload', `${fmtInt(d.payload_bytes)} bytes`], ['dead-lettered', fmtTime(d.published_at)],
          d.problem ? ['problem', d.problem] : null,
        ].filter(Boolean))),
        h('h2', { text: 'Payload' }), h('div', { class: 'toolbar' }, toggles), pre,
        h('h2', { text: 'Headers' }), headerTable(user, 'entry-headers'),
        h('h2', { text: 'Provenance' }), headerTable(provenance, 'entry-provenance'));
    } catch (err) {
      if (gen === generation) {
        show(h('p', {}, h('a', { href: listHref, text: 'Back to the list' })));
        fail(err);
      }
    }
  })();
}

// ----------------------------------------------------------------------- state

function fmtBytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let x = Number(n);
  let u = 0;
  while (x >= 1024 && u < units.length - 1) {
    x /= 1024;
    u += 1;
  }
  return u === 0 ? `${x} B` : `${x.toFixed(x >= 100 ? 0 : 1)} ${units[u]}`;
}

/**
 * A stage's state store (`state:`): its totals, its keys by prefix, a page
 * at a time (`after`), and, with the full token, a key's value and its
 * delete. The read token lists keys and sizes only: the server refuses it
 * values (403), so the page never asks.
 */
function stateView(pipeline, stage, query) {
  const gen = generation;
  const base = `/v1/state/${pathPart(pipeline)}/${pathPart(stage)}`;
  const here = `#/state/${pathPart(pipeline)}/${pathPart(stage)}`;
  crumbs({ text: 'overview', href: '#/' }, { text: pipeline },
    { text: stage, href: `#/stage/${pathPart(pipeline)}/${pathPart(stage)}` }, { text: 'state' });
  const prefix = query.get('prefix') || '';
  const limit = query.get('limit') || '100';

  const prefixInput = h('input', { name: 'prefix', class: 'mono', placeholder: 'key prefix', testid: 'state-prefix' });
  prefixInput.value = prefix;
  const form = h('form', { class: 'toolbar panel', testid: 'state-search', on: { submit: search } },
    h('label', {}, 'prefix', prefixInput),
    h('button', { type: 'submit', testid: 'state-search-submit', text: 'Filter' }),
    h('button', { type: 'button', class: 'quiet', text: 'Clear', on: { click: () => { location.hash = here; } } }));

  function search(event) {
    event.preventDefault();
    const q = new URLSearchParams();
    if (prefixInput.value) q.set('prefix', prefixInput.value);
    if (limit !== '100') q.set('limit', limit);
    const target = `${here}${q.toString() ? `?${q}` : ''}`;
    if (location.hash === target) route();
    else location.hash = target;
  }

  const totals = h('div', { class: 'panel stats', testid: 'state-totals' }, h('span', { class: 'muted', text: 'Loading…' }));
  const summary = h('p', { class: 'muted', testid: 'state-summary', text: 'Loading…' });
  const table = h('div', { testid: 'state-list' });
  const more = h('button', { type: 'button', testid: 'state-more', hidden: true, text: 'More', on: { click: () => load(true) } });
  const valueBox = h('div', { testid: 'state-value-box', hidden: true });
  const readNote = canWrite() ? null : h('p', { class: 'muted', testid: 'state-read-only',
    text: 'Signed in with the read token: keys and sizes only. A value is the handler\'s data; it needs the full token.' });

  show(h('h1', {}, `State of ${pipeline} / ${stage}`), totals, form, readNote, summary, table,
    h('div', { class: 'toolbar' }, more), valueBox);

  /** The keys shown so far (every page loaded), and whether more follow. */
  let entries = [];
  let hasMore = false;
  /** The key whose value is shown, if any. */
  let shownKey = null;
  let busy = false;

  function drawTotals(list) {
    const item = (label, testid, value, text) => h('div', {},
      h('b', { testid, dataset: { value: String(value) }, text }), h('span', { text: label }));
    const pct = list.max_bytes ? (100 * list.bytes) / list.max_bytes : null;
    const used = pct === null ? '' : ` (${list.bytes > 0 && pct < 0.01 ? '<0.01' : pct.toFixed(pct < 1 ? 2 : 1)}% of the limit)`;
    totals.replaceChildren(
      item('store', 'state-store', list.store, list.store),
      item('keys', 'state-keys', list.keys, fmtInt(list.keys)),
      item('bytes', 'state-bytes', list.bytes, `${fmtBytes(list.bytes)}${used}`),
      item('max bytes', 'state-max-bytes', list.max_bytes, fmtBytes(list.max_bytes)));
  }

  function drawTable() {
    summary.textContent = `${entries.length} key${entries.length === 1 ? '' : 's'} shown${prefix ? ` under prefix ${prefix}` : ''}`
      + `${hasMore ? '; more follow' : ''}.`;
    more.hidden = !hasMore;
    if (!entries.length) {
      table.replaceChildren(h('p', { class: 'muted', text: prefix ? 'No key has this prefix.' : 'The store is empty.' }));
      return;
    }
    const rows = entries.map((e) => h('tr', { testid: 'state-row', dataset: { key: e.key }, class: e.key === shownKey ? 'selected' : null },
      h('td', { class: 'mono', testid: 'state-key', text: e.key }),
      h('td', { class: 'mono', testid: 'state-size', dataset: { value: String(e.size) }, text: fmtInt(e.size) }),
      h('td', { class: 'mono', testid: 'state-revision', text: String(e.revision) }),
      h('td', { class: 'mono', testid: 'state-expires', text: e.expires_at ? fmtTime(e.expires_at) : 'never' }),
      h('td', { class: 'mono', text: fmtTime(e.written_at) }),
      h('td', { class: 'mono', text: e.writer || '(operator)' }),
      canWrite() ? h('td', { class: 'actions' },
        h('button', { type: 'button', class: 'toggle', testid: 'state-show', text: 'Value', on: { click: () => showValue(e.key) } }),
        h('button', { type: 'button', class: 'danger', testid: 'state-delete', text: 'Delete', on: { click: () => remove(e.key) } }))
        : null));
    table.replaceChildren(h('table', {},
      h('thead', {}, h('tr', {}, ['key', 'size (bytes)', 'revision', 'expires', 'written', 'writer']
        .map((t) => h('th', { text: t })), canWrite() ? h('th', { text: '' }) : null)),
      h('tbody', {}, rows)));
  }

  function listPath(after, pageLimit) {
    const q = new URLSearchParams();
    if (prefix) q.set('prefix', prefix);
    if (after !== null && after !== undefined) q.set('after', after);
    q.set('limit', String(pageLimit));
    return `${base}?${q}`;
  }

  /** The first page again, or (`next`) the page after the last key shown. */
  async function load(next) {
    if (busy) return;
    busy = true;
    more.disabled = true;
    try {
      const after = next && entries.length ? entries[entries.length - 1].key : null;
      const list = await api('GET', listPath(after, limit));
      if (gen !== generation) return;
      entries = next ? entries.concat(list.entries) : list.entries;
      hasMore = list.more;
      drawTotals(list);
      drawTable();
    } catch (err) {
      if (gen === generation) {
        summary.textContent = '';
        fail(err);
      }
    } finally {
      busy = false;
      more.disabled = false;
    }
  }

  /** The totals, every poll (the table stays as paged). */
  async function pollTotals() {
    try {
      const list = await api('GET', listPath(null, 1));
      if (gen === generation) drawTotals(list);
    } catch (err) {
      if (gen === generation) fail(err);
    }
  }

  async function showValue(key) {
    try {
      const v = await api('GET', `${base}/keys/${pathPart(key)}`);
      if (gen !== generation) return;
      shownKey = key;
      const text = v.value !== null && v.value !== undefined;
      const kv = (pairs) => h('dl', { class: 'kv' }, pairs.map(([k, val, testid]) => [h('dt', { text: k }), h('dd', { testid, text: val ?? '–' })]));
      valueBox.replaceChildren(
        h('h2', {}, 'Value of ', h('span', { class: 'mono', testid: 'state-value-key', text: key })),
        h('div', { class: 'panel' }, kv([
          ['size', `${fmtInt(v.size)} bytes (key and value)`], ['revision', String(v.revision), 'state-value-revision'],
          ['written', fmtTime(v.written_at)], ['writer', v.writer || '(operator)'],
          ['expires', v.expires_at ? fmtTime(v.expires_at) : 'never'],
          ['encoding', text ? 'text (UTF-8)' : 'base64 (not UTF-8)', 'state-value-encoding'],
        ])),
        h('pre', { testid: 'state-value', dataset: { encoding: text ? 'text' : 'base64' }, text: text ? v.value : (v.value_base64 || '') }));
      valueBox.hidden = false;
      drawTable();
    } catch (err) {
      if (gen !== generation) return;
      if (err instanceof ApiError && err.status === 403) {
        // The server's own refusal (the read token): said, never worked around.
        valueBox.replaceChildren(h('p', { class: 'err', testid: 'state-value-refused', text: err.body && err.body.error ? err.body.error : err.message }));
        valueBox.hidden = false;
      }
      fail(err);
    }
  }

  async function remove(key) {
    try {
      const ok = await confirmDialog('Delete state key',
        ['Delete ', h('b', { class: 'mono', testid: 'confirm-key', text: key }), ` from the store of ${pipeline}/${stage}? `
          + 'The handler sees it absent from its next call; a call that read it meanwhile runs again. This cannot be undone.'],
        'Delete');
      if (!ok || gen !== generation) return;
      const done = await api('DELETE', `${base}/keys/${pathPart(key)}`);
      notice(done.deleted ? `Deleted ${done.key}.` : `${done.key} was already gone.`);
      if (shownKey === key) {
        shownKey = null;
        valueBox.replaceChildren();
        valueBox.hidden = true;
      }
      entries = [];
      await load(false);
    } catch (err) {
      fail(err);
    }
  }

  load(false);
  every(POLL_MS, pollTotals);
}

// ----------------------------------------------------------------------- topic

function topicView(topic) {
  const gen = generation;
  const base = `/v1/topics/${pathPart(topic)}`;
  crumbs({ text: 'overview', href: '#/' }, { text: `topic ${topic}` });
  const stats = h('div', { class: 'panel stats', testid: 'topic-stats' });
  const list = h('div', { class: 'tail panel', testid: 'topic-tail' }, h('p', { class: 'muted', text: 'Waiting for messages…' }));
  const state = h('span', { class: 'muted', testid: 'topic-state', text: 'live' });
  const toggle = h('button', { type: 'button', testid: 'topic-pause', text: 'Pause', on: { click: flip } });
  show(h('h1', { text: `Topic ${topic}` }), stats,
    h('div', { class: 'toolbar' }, toggle, state), list);

  let running = true;
  let next = null;
  let controller = null;
  let loop = 0;
  let shown = 0;
  cleanups.push(() => {
    running = false;
    if (controller) controller.abort();
  });

  function flip() {
    running = !running;
    toggle.textContent = running ? 'Pause' : 'Resume';
    state.textContent = running ? 'live' : 'paused';
    if (running) tail();
    else if (controller) controller.abort();
  }

  function addMessages(messages) {
    if (!messages.length) return;
    if (!shown) list.replaceChildren();
    for (const m of messages) {
      const bytes = m.payload !== undefined && m.payload !== null ? m.payload : `(base64) ${m.payload_base64 || ''}`;
      list.prepend(h('div', { class: 'msg', testid: 'tail-message', dataset: { seq: String(m.seq), id: m.id } },
        h('div', { class: 'meta' }, `#${m.seq}  ${fmtTime(m.published_at)}  id=${m.id}${m.key ? `  key=${m.key}` : ''}`
          + (m.headers.length ? `  ${m.headers.map(([n, v]) => `${n}=${v}`).join(' ')}` : '')),
        h('div', { text: bytes.length > 2000 ? `${bytes.slice(0, 2000)}…` : bytes })));
      shown += 1;
    }
    while (list.children.length > TAIL_KEEP) list.lastChild.remove();
  }

  async function refreshStats() {
    const t = await api('GET', base);
    if (gen !== generation) return t;
    const item = (label, testid, text) => h('div', {}, h('b', { testid, text }), h('span', { text: label }));
    stats.replaceChildren(
      item('stored', 'topic-depth', fmtInt(t.depth)),
      item('first seq', 'topic-first', fmtInt(t.first_seq)),
      item('last seq', 'topic-last', fmtInt(t.last_seq)),
      item('oldest', 'topic-oldest', fmtSeconds(t.oldest_age_seconds)),
      item('kind', 'topic-kind', t.dead_letter ? 'dead letters' : 'topic'));
    return t;
  }

  async function tail() {
    loop += 1;
    const mine = loop;
    try {
      if (next === null) {
        const t = await refreshStats();
        // Start with the newest 20 stored messages.
        next = Math.max(t.first_seq || 1, t.last_seq - 19, 1);
      }
      while (running && gen === generation && mine === loop) {
        controller = new AbortController();
        const page = await api('GET', `${base}/messages?from=${next}&max=100&wait_ms=${TAIL_WAIT_MS}`, undefined, controller.signal);
        if (gen !== generation || mine !== loop) return;
        addMessages(page.messages);
        next = page.next;
        list.dataset.next = String(next);
        if (page.messages.length) refreshStats().catch(fail);
      }
    } catch (err) {
      if (err.name === 'AbortError' || gen !== generation) return;
      fail(err);
      state.textContent = 'stopped (error)';
      running = false;
      toggle.textContent = 'Resume';
    }
  }
  tail();
}

boot();
