// The live parts of the scheduler's /status page: the job's progress bar
// with its ETA, a table of the shards and one uPlot chart per family of
// curves, all from /status.json (proto ps.StatusReport as JSON: proto field
// names, uint64 as strings, unknown optional fields absent), fetched every
// 2 s; and the page's server-rendered tables (#tables), replaced from a
// fresh /status as often, so the page never reloads as a whole.
//
// Plain ES2017, no build step. Every request goes to the page's own
// scheduler (relative URLs); uPlot comes from /static/ too.
//
// The chart containers come from the page (scheduler/status_page_charts.cc):
// each .chart[data-family] draws the series named data-family, or every
// series whose name starts with it when it ends in '/'. Once drawn a
// container carries data-series (the names drawn, comma separated) and
// data-points (the points drawn); one with nothing to draw shows "no data
// yet" and carries neither.
(function () {
  'use strict';

  const POLL_MS = 2000;
  const CHART_HEIGHT = 200;
  const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd',
                  '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];

  // ------------------------------------------------------------ formatting

  function pad2(n) { return String(n).padStart(2, '0'); }

  // "3m 12s", "1h 05m", "2d 3h", "45s".
  function fmtDuration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    const d = Math.floor(s / 86400);
    const h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60);
    const sec = s % 60;
    if (d > 0) return d + 'd ' + h + 'h';
    if (h > 0) return h + 'h ' + pad2(m) + 'm';
    if (m > 0) return m + 'm ' + pad2(sec) + 's';
    return sec + 's';
  }

  // Local time, "2025-11-29 21:53:10".
  function fmtTime(unixSeconds) {
    const t = new Date(unixSeconds * 1000);
    return t.getFullYear() + '-' + pad2(t.getMonth() + 1) + '-' +
        pad2(t.getDate()) + ' ' + pad2(t.getHours()) + ':' +
        pad2(t.getMinutes()) + ':' + pad2(t.getSeconds());
  }

  // 3 significant digits below 1000, grouped integers above.
  function fmtNumber(v) {
    if (v == null || !isFinite(v)) return '\u2014';
    const a = Math.abs(v);
    if (a >= 1000) return Math.round(v).toLocaleString('en-US');
    if (a === 0) return '0';
    return Number(v.toPrecision(3)).toString();
  }

  // Short axis labels: 1.2k, 3.4M, 5G.
  function fmtCompact(v) {
    if (v == null || !isFinite(v)) return '';
    const a = Math.abs(v);
    const units = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
    for (const [size, suffix] of units) {
      if (a >= size) return Number((v / size).toPrecision(3)) + suffix;
    }
    return Number(v.toPrecision(3)).toString();
  }

  // 1000-based, as the page's tables: "180.2 kB", "1.5 GB".
  function fmtBytes(v) {
    if (v == null || !isFinite(v)) return '\u2014';
    const units = [[1e12, 'TB'], [1e9, 'GB'], [1e6, 'MB'], [1e3, 'kB']];
    for (const [size, suffix] of units) {
      if (Math.abs(v) >= size) return (v / size).toFixed(1) + ' ' + suffix;
    }
    return Math.round(v) + ' B';
  }

  // Axis labels: 3 significant digits, "180 kB", "1.5 GB".
  function fmtBytesShort(v) {
    if (v == null || !isFinite(v)) return '';
    const units = [[1e12, 'TB'], [1e9, 'GB'], [1e6, 'MB'], [1e3, 'kB']];
    for (const [size, suffix] of units) {
      if (Math.abs(v) >= size) return Number((v / size).toPrecision(3)) + ' ' + suffix;
    }
    return Math.round(v) + ' B';
  }

  function fmtPercent(fraction) {
    return (100 * fraction).toFixed(1) + '%';
  }

  // How a chart's data-unit formats values on the axis and in the legend.
  function formatters(unit) {
    if (unit === 'bytes') return {axis: fmtBytesShort, legend: fmtBytes};
    if (unit === 'fraction') {
      return {axis: (v) => (100 * v).toFixed(0) + '%', legend: fmtPercent};
    }
    return {axis: fmtCompact, legend: fmtNumber};
  }

  // uint64 fields arrive as strings, doubles as numbers; absent is null.
  function num(v) {
    if (v === undefined || v === null || v === '') return null;
    const n = Number(v);
    return isFinite(n) ? n : null;
  }

  function el(tag, className, text) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // ------------------------------------------------------------ progress

  // The newest point of metric `name` over every worker rank, or null.
  function newestMetric(metrics, name) {
    let best = null;
    for (const m of metrics || []) {
      if (m.name !== name || num(m.value) === null) continue;
      if (best === null || num(m.unix_s) > num(best.unix_s)) best = m;
    }
    return best;
  }

  function etaText(report, job) {
    if (report.state === 'FINISHED') return 'finished';
    if (report.state === 'FAILED') return 'failed';
    const eta = num(job.eta_s);
    return eta === null ? 'ETA unknown' : 'ETA ' + fmtDuration(eta);
  }

  function renderProgress(report) {
    const job = report.job || {};
    const fraction = Math.min(1, Math.max(0, num(job.progress) || 0));
    const fill = document.getElementById('progress-fill');
    const percent = document.getElementById('progress-percent');
    const bar = fill && fill.parentElement;
    if (fill) {
      fill.style.width = (100 * fraction).toFixed(2) + '%';
      fill.classList.toggle('finished', report.state === 'FINISHED');
      fill.classList.toggle('failed', report.state === 'FAILED');
    }
    if (percent) percent.textContent = fmtPercent(fraction);
    if (bar) bar.setAttribute('aria-valuenow', (100 * fraction).toFixed(1));

    const text = document.getElementById('progress-text');
    if (!text) return;
    const parts = [];
    parts.push(el('span', 'eta', etaText(report, job)));
    if (num(job.elapsed_s) !== null) {
      parts.push(el('span', '', 'elapsed ' + fmtDuration(num(job.elapsed_s))));
    }
    const total = num(job.steps_total);
    parts.push(el('span', '', 'steps ' + fmtNumber(num(job.steps_done) || 0) +
        ' / ' + (job.total_known ? '' : '~') +
        (total ? fmtNumber(total) : '?')));
    parts.push(el('span', '',
        fmtNumber(num(job.examples_per_second) || 0) + ' examples/s'));
    const labels = [['test_auc', 'test AUC'], ['test_logloss', 'test logloss'],
                    ['test_accuracy', 'test accuracy']];
    for (const [name, label] of labels) {
      const m = newestMetric(job.metrics, name);
      if (m === null) continue;
      parts.push(el('span', 'metric', label + ' ' + num(m.value).toFixed(4) +
          ' (step ' + fmtNumber(num(m.step) || 0) + ')'));
    }
    const line = [];
    parts.forEach((part, i) => {
      if (i > 0) line.push(el('span', 'sep', ' \u00b7 '));
      line.push(part);
    });
    text.replaceChildren(...line);
    renderShards(job.shards || []);
  }

  function miniBar(fraction) {
    const cell = el('td', 'bar');
    const outer = el('span', 'mini-bar');
    const inner = el('div');
    inner.style.width = (100 * fraction).toFixed(1) + '%';
    outer.appendChild(inner);
    cell.appendChild(outer);
    cell.appendChild(document.createTextNode(fmtPercent(fraction)));
    return cell;
  }

  function renderShards(shards) {
    const table = document.getElementById('shards');
    if (!table) return;
    if (shards.length === 0) {
      table.replaceChildren();
      return;
    }
    const head = el('tr');
    for (const h of ['Shard', 'Worker', 'State', 'Progress', 'Steps',
                     'Steps/s', 'ETA', 'Loss']) {
      head.appendChild(el('th', '', h));
    }
    const rows = [head];
    for (const s of shards) {
      const tr = el('tr');
      const rank = num(s.worker_rank);
      const total = num(s.steps_total);
      const eta = num(s.eta_s);
      const pace = num(s.steps_per_second);
      const loss = num(s.loss);
      tr.appendChild(el('td', 'num', String(num(s.shard) || 0)));
      tr.appendChild(el('td', '', rank === null ? '\u2014' : 'worker/' + rank));
      tr.appendChild(el('td', '', s.state || ''));
      tr.appendChild(miniBar(Math.min(1, Math.max(0, num(s.progress) || 0))));
      tr.appendChild(el('td', 'num', fmtNumber(num(s.steps_done) || 0) +
          ' / ' + (total ? fmtNumber(total) : '?')));
      tr.appendChild(el('td', 'num', pace === null ? '\u2014' : fmtNumber(pace)));
      tr.appendChild(el('td', 'num', eta === null ? '\u2014' : fmtDuration(eta)));
      tr.appendChild(el('td', 'num', loss === null ? '\u2014' : loss.toFixed(4)));
      rows.push(tr);
    }
    table.replaceChildren(...rows);
  }

  // ------------------------------------------------------------ charts

  // Natural order: "loss/worker/2" before "loss/worker/10".
  function compareNames(a, b) {
    const pa = a.split('/');
    const pb = b.split('/');
    for (let i = 0; i < Math.min(pa.length, pb.length); i++) {
      if (pa[i] === pb[i]) continue;
      const na = Number(pa[i]);
      const nb = Number(pb[i]);
      if (pa[i] !== '' && pb[i] !== '' && isFinite(na) && isFinite(nb)) {
        return na - nb;
      }
      return pa[i] < pb[i] ? -1 : 1;
    }
    return pa.length - pb.length;
  }

  function inFamily(name, family) {
    return family.endsWith('/') ? name.startsWith(family) : name === family;
  }

  // The legend's name of a series: "worker 0" for loss/worker/0, "test_auc"
  // for metric/test_auc, the name itself for a family of one.
  function label(name, family) {
    if (!family.endsWith('/')) return name === 'examples_per_s' ? 'examples/s' : name;
    const rest = name.slice(family.length);
    const parts = family.split('/').filter((p) => p !== '');
    return parts.length >= 2 ? parts[parts.length - 1] + ' ' + rest : rest;
  }

  // The series of one chart on one x axis: the union of their time stamps,
  // each series null where it has no point (uPlot needs aligned data; the
  // lines span the gaps). Returns {names, data, points}.
  function align(seriesList) {
    const xs = new Set();
    const maps = [];
    let points = 0;
    for (const s of seriesList) {
      const byT = new Map();
      const t = s.t || [];
      const v = s.v || [];
      for (let i = 0; i < Math.min(t.length, v.length); i++) {
        const x = num(t[i]);
        const y = num(v[i]);
        if (x === null || y === null) continue;
        if (!byT.has(x)) points++;
        byT.set(x, y);
        xs.add(x);
      }
      maps.push(byT);
    }
    const x = Array.from(xs).sort((a, b) => a - b);
    const data = [x];
    for (const byT of maps) {
      data.push(x.map((t) => (byT.has(t) ? byT.get(t) : null)));
    }
    return {names: seriesList.map((s) => s.name), data: data, points: points};
  }

  // Charts drawn so far, by container id: {plot, key, full: [xmin, xmax]}.
  const charts = new Map();

  function chartWidth(container) {
    return Math.max(200, container.clientWidth || 600);
  }

  function makePlot(container, family, unit, names, data) {
    const fmt = formatters(unit);
    const series = [{}];
    names.forEach((name, i) => {
      series.push({
        label: label(name, family),
        stroke: COLORS[i % COLORS.length],
        width: 1.5,
        spanGaps: true,
        value: (u, v) => (v == null ? '\u2014' : fmt.legend(v)),
      });
    });
    const opts = {
      width: chartWidth(container),
      height: CHART_HEIGHT,
      scales: {x: {time: true}, y: unit === 'fraction' ? {range: [0, 1]} : {}},
      series: series,
      axes: [{}, {size: 70, values: (u, splits) => splits.map(fmt.axis)}],
      cursor: {drag: {x: true, y: false}},
      legend: {live: true},
    };
    return new uPlot(opts, data, container);
  }

  function showNoData(container, message) {
    const entry = charts.get(container.id);
    if (entry) {
      entry.plot.destroy();
      charts.delete(container.id);
    }
    container.removeAttribute('data-series');
    container.removeAttribute('data-points');
    container.replaceChildren(el('div', 'no-data', message));
  }

  function drawChart(container, allSeries) {
    const family = container.dataset.family || '';
    const unit = container.dataset.unit || '';
    const mine = allSeries
        .filter((s) => inFamily(s.name, family) && (s.t || []).length > 0)
        .sort((a, b) => compareNames(a.name, b.name));
    const aligned = align(mine);
    if (aligned.points === 0) {
      showNoData(container, 'no data yet');
      return;
    }
    if (typeof uPlot === 'undefined') {
      showNoData(container, 'the chart library (/static/uplot.iife.min.js) did not load');
      return;
    }
    const x = aligned.data[0];
    const full = [x[0], x[x.length - 1]];
    const key = aligned.names.join(',');
    let entry = charts.get(container.id);
    if (entry && entry.key === key) {
      // Keep the reader's zoom (a drag selects a time range; a double click
      // resets it): rescale only when the whole previous range was shown.
      const sx = entry.plot.scales.x;
      const zoomed = sx.min > entry.full[0] || sx.max < entry.full[1];
      entry.plot.setData(aligned.data, !zoomed);
      entry.full = full;
    } else {
      if (entry) entry.plot.destroy();
      container.replaceChildren();
      entry = {plot: makePlot(container, family, unit, aligned.names, aligned.data),
               key: key, full: full};
      charts.set(container.id, entry);
    }
    container.setAttribute('data-series', key);
    container.setAttribute('data-points', String(aligned.points));
  }

  function renderCharts(report) {
    const since = document.getElementById('charts-since');
    if (since && num(report.series_since) !== null) {
      since.textContent = 'curves since ' + fmtTime(num(report.series_since)) +
          ' (when this scheduler started; evaluation metrics may reach further' +
          ' back). Drag to zoom, double-click to reset.';
    }
    const series = report.series || [];
    for (const container of document.querySelectorAll('.chart[data-family]')) {
      drawChart(container, series);
    }
  }

  function resizeCharts() {
    for (const [id, entry] of charts) {
      const container = document.getElementById(id);
      if (container) entry.plot.setSize({width: chartWidth(container), height: CHART_HEIGHT});
    }
  }

  // ------------------------------------------------------------ polling

  let lastAnswer = null;

  function showError(message) {
    const text = document.getElementById('progress-text');
    if (!text) return;
    let e = text.querySelector('.error');
    if (!e) {
      e = el('span', 'error');
      text.appendChild(e);
    }
    e.textContent = message;
  }

  async function updateReport() {
    let response;
    try {
      response = await fetch('/status.json', {cache: 'no-store'});
    } catch (err) {
      const since = lastAnswer ? ' since ' + fmtTime(lastAnswer / 1000) : '';
      showError('no answer from the scheduler' + since);
      return;
    }
    if (!response.ok) {
      showError('/status.json answered ' + response.status);
      if (response.status === 404) {
        for (const c of document.querySelectorAll('.chart[data-family]')) {
          showNoData(c, 'no data yet (this scheduler serves no /status.json)');
        }
      }
      return;
    }
    const report = await response.json();
    lastAnswer = Date.now();
    renderProgress(report);
    renderCharts(report);
  }

  async function updateTables() {
    let html;
    try {
      const response = await fetch('/status', {cache: 'no-store'});
      if (!response.ok) return;
      html = await response.text();
    } catch (err) {
      return;  // updateReport says the scheduler is gone
    }
    const doc = new DOMParser().parseFromString(html, 'text/html');
    const fresh = doc.getElementById('tables');
    const current = document.getElementById('tables');
    if (fresh && current) {
      const node = document.importNode(fresh, true);
      // How many times the tables were replaced (tests read it).
      node.dataset.refreshes = String(Number(current.dataset.refreshes || 0) + 1);
      current.replaceWith(node);
    }
    if (doc.title) document.title = doc.title;
  }

  // The tables came with the page: the first poll leaves them.
  let firstPoll = true;

  async function poll() {
    try {
      const tables = firstPoll ? Promise.resolve() : updateTables();
      firstPoll = false;
      await Promise.all([updateReport(), tables]);
    } catch (err) {
      showError(String(err));
    }
    setTimeout(poll, POLL_MS);
  }

  let resizePending = false;
  window.addEventListener('resize', () => {
    if (resizePending) return;
    resizePending = true;
    requestAnimationFrame(() => {
      resizePending = false;
      resizeCharts();
    });
  });

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', poll);
  } else {
    poll();
  }
})();
