/* headatlas atlas page: plain JS, no libraries, no network. Data: the JSON in #atlas-data
   (scripts/headatlas/atlas/page.py). Heads are named 1-based "layer-head"; layer 1 is the top
   row of every grid, head 1 the left column. */
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("atlas-data").textContent);
  const MODELS = DATA.models;
  // bidirectional-text controls (U+202E right-to-left override ...) in corpus text or ids would reorder the text
  // after them: every text the page writes shows them escaped, as [U+202E]
  const BIDI = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;
  function safe(s) { return String(s).replace(BIDI, (c) => "[U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "]"); }
  MODELS.forEach((m) => ((m.examples || {}).sentences || []).forEach((x) => { x.record_id = safe(x.record_id); x.units = x.units.map(safe); }));
  const byName = {};
  MODELS.forEach((m) => { byName[m.model] = m; });
  const GRID_H = 480, GRID_W = 280;
  const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];
  const DIVERGING = ["#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b"];
  const CATS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const state = { a: MODELS.length ? MODELS[0].model : null, b: MODELS.length > 1 ? MODELS[1].model : "", column: DATA.default_column,
                  role: "", mode: "fdr", op: ">=", threshold: "", kv: "", selected: null };

  // --- helpers -------------------------------------------------------------------------
  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === "text") e.textContent = safe(attrs[k]);
      else if (k === "class") e.className = attrs[k];
      else e.setAttribute(k, k === "aria-label" || k === "title" ? safe(attrs[k]) : attrs[k]);
    }
    (children || []).forEach((c) => e.appendChild(typeof c === "string" ? document.createTextNode(safe(c)) : c));
    return e;
  }
  function svgEl(tag, attrs) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }
  function fmt(v, kind) {
    if (v === null || v === undefined) return "n/a";
    if (kind === "bool" || typeof v === "boolean") return v ? "True" : "False";
    if (typeof v === "number") {
      if (Number.isInteger(v)) return String(v);
      const a = Math.abs(v);
      return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(3) : String(Number(v.toPrecision(4)));
    }
    return String(v);
  }
  function colInfo(m, name) { return m.columns.find((c) => c.name === name) || null; }
  // how a value was obtained (its column's <name>_kind column, atlas/columns.py): "" when the atlas says nothing
  function kindOf(m, name, i) {
    const c = colInfo(m, name), vals = c && c.kinds ? m.values[c.kinds] : null;
    const k = vals ? vals[i] : null;
    return k === null || k === undefined ? "" : String(k);
  }
  function kindClass(k) {
    if (!k) return "";
    if (k.startsWith("skipped")) return "skipped";
    if (k.startsWith("estimated")) return "estimated";
    return (k === "exact" || k === "unreliable") ? k : "";
  }
  function isEffect(k) { const c = kindClass(k); return c !== "unreliable" && c !== "skipped"; }
  const NOT_EFFECT = "#9e9e9e";  // unreliable or skipped values: grey, never on the colour scale
  function withUnit(c) { return c.desc + (c.unit ? " (" + c.unit + ")" : ""); }
  function numeric(v) { return v === null || v === undefined ? NaN : (typeof v === "boolean" ? (v ? 1 : 0) : (typeof v === "number" ? v : NaN)); }
  function lerpColour(stops, t) {
    t = Math.min(1, Math.max(0, t));
    const x = t * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
    const p = (h) => [1, 3, 5].map((j) => parseInt(h.substr(j, 2), 16));
    const a = p(stops[i]), b = p(stops[i + 1]);
    return "rgb(" + a.map((v, j) => Math.round(v + (b[j] - v) * f)).join(",") + ")";
  }
  function shownModels() { return [state.a, state.b].filter((x, i, arr) => x && arr.indexOf(x) === i).map((x) => byName[x]); }
  function allColumns() {
    const seen = new Map();
    MODELS.forEach((m) => m.columns.forEach((c) => { if (!seen.has(c.name)) seen.set(c.name, c); }));
    return Array.from(seen.values());
  }
  function rankOf(m, name, i) {
    const c = colInfo(m, name);
    if (!c || c.kind === "text") return null;
    const vals = m.values[name].map(numeric), v = vals[i];
    if (!Number.isFinite(v)) return null;
    let higher = 0, n = 0;
    vals.forEach((x) => { if (Number.isFinite(x)) { n += 1; if (x > v) higher += 1; } });
    return { rank: higher + 1, n: n };
  }

  // --- the colour scale of the chosen column, shared by the shown models ----------------------
  function scale() {
    const name = state.column, models = shownModels();
    const info = models.map((m) => colInfo(m, name)).find((c) => c) || { name: name, kind: "number", desc: "" };
    if (info.kind === "text") {
      const cats = [];
      models.forEach((m) => (m.values[name] || []).forEach((v) => { if (v !== null && cats.indexOf(v) < 0) cats.push(v); }));
      cats.sort();
      return { info: info, kind: "text", cats: cats, colour: (v) => v === null ? null : CATS[cats.indexOf(v) % CATS.length] };
    }
    if (info.kind === "bool") return { info: info, kind: "bool", colour: (v) => v === null ? null : (v ? "#08306b" : "#c6dbef") };
    let lo = Infinity, hi = -Infinity;
    models.forEach((m) => (m.values[name] || []).forEach((v, i) => {
      if (Number.isFinite(v) && isEffect(kindOf(m, name, i))) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    }));
    if (!Number.isFinite(lo)) { lo = 0; hi = 1; }
    if (lo < 0 && hi > 0) {
      const r = Math.max(-lo, hi);
      return { info: info, kind: "diverging", lo: -r, hi: r, colour: (v) => Number.isFinite(v) ? lerpColour(DIVERGING, (v + r) / (2 * r)) : null };
    }
    const span = hi - lo || 1;
    return { info: info, kind: "sequential", lo: lo, hi: hi, colour: (v) => Number.isFinite(v) ? lerpColour(VIRIDIS, (v - lo) / span) : null };
  }

  function renderLegend(sc) {
    const box = document.getElementById("legend");
    box.textContent = "";
    box.appendChild(el("span", { class: "what", text: "Colour: " + sc.info.name }));
    if (sc.kind === "sequential" || sc.kind === "diverging") {
      const stops = sc.kind === "sequential" ? VIRIDIS : DIVERGING;
      const wrap = el("span", {});
      const bar = el("div", { class: "bar", role: "img",
        "aria-label": "colour scale from " + fmt(sc.lo) + " to " + fmt(sc.hi) + (sc.kind === "diverging" ? ", white at 0" : "") });
      bar.style.background = "linear-gradient(to right," + stops.join(",") + ")";
      const ticks = el("div", { class: "ticks" }, [el("span", { text: fmt(sc.lo) }), el("span", { text: fmt((sc.lo + sc.hi) / 2) }), el("span", { text: fmt(sc.hi) })]);
      wrap.appendChild(bar); wrap.appendChild(ticks); box.appendChild(wrap);
    } else if (sc.kind === "bool") {
      box.appendChild(el("span", { class: "cats" }, [swatch("#08306b"), "True ", swatch("#c6dbef"), "False"]));
    } else {
      box.appendChild(el("span", { class: "cats" }, sc.cats.map((c) => el("span", {}, [swatch(sc.colour(c)), c]))));
    }
    const na = el("span", {}, [el("span", { class: "swatch cell na" }), "no value"]);
    box.appendChild(na);
    if (shownModels().some((m) => { const c = colInfo(m, sc.info.name); return c && c.kinds; })) {
      box.appendChild(el("span", { class: "kinds" }, [el("span", { class: "swatch cell kind-estimated" }), "estimate (checked), hatched; ",
        el("span", { class: "swatch cell kind-unreliable" }), "unreliable or skipped: not an effect, grey"]));
    }
    box.appendChild(el("span", { class: "desc", text: withUnit(sc.info) + (sc.kind === "diverging" ? "; scale centred on 0" : "") +
      "; shared by the models shown" }));
  }
  function swatch(c) { const s = el("span", { class: "swatch" }); s.style.background = c; return s; }

  // --- filters ---------------------------------------------------------------------------
  function filterActive() { return state.role !== "" || state.threshold !== "" || state.kv !== ""; }
  function matches(m, i) {
    if (state.role !== "") {
      const r = m.roles.find((x) => x.role === state.role);
      const col = r && r[state.mode];
      if (!col || m.values[col][i] !== true) return false;
    }
    if (state.threshold !== "") {
      const t = Number(state.threshold), vals = m.values[state.column];
      const v = vals ? numeric(vals[i]) : NaN;
      if (!Number.isFinite(t) || !Number.isFinite(v) || !isEffect(kindOf(m, state.column, i))) return false;
      if (state.op === ">=" ? !(v >= t) : !(v <= t)) return false;
    }
    if (state.kv !== "") {
      const vals = m.values.det_kv_group;
      if (!m.kv_shared || !vals || String(vals[i]) !== state.kv) return false;
    }
    return true;
  }

  // --- grids -----------------------------------------------------------------------------
  function cellLabel(m, i, sc) {
    const L = Math.floor(i / m.n_heads) + 1, H = (i % m.n_heads) + 1;
    const v = m.values[state.column] ? m.values[state.column][i] : null;
    const r = rankOf(m, state.column, i), k = kindOf(m, state.column, i);
    return m.model + " head " + m.labels[i] + " (layer " + L + ", head " + H + "): " + state.column + " " + fmt(v, sc.info.kind) +
      (k ? " (" + k + ")" : "") + (r ? ", rank " + r.rank + " of " + r.n : "") + (filterActive() ? (matches(m, i) ? ", matches the filters" : ", filtered out") : "");
  }

  function renderPanel(m, sc) {
    const panel = el("section", { class: "panel", "data-model": m.model, "aria-label": "model " + m.model });
    panel.appendChild(el("h2", { text: m.model + " (" + m.n_layers + " layers x " + m.n_heads + " heads)" }));
    const n = m.n_layers * m.n_heads;
    let count = 0;
    for (let i = 0; i < n; i++) if (matches(m, i)) count += 1;
    panel.appendChild(el("p", { class: "status", "data-model": m.model, "aria-live": "polite",
      text: filterActive() ? count + " of " + n + " heads match the filters" : n + " heads; no filter" }));
    const dropped = (m.examples || {}).dropped || [];
    if (dropped.length) panel.appendChild(el("p", { class: "note dropped", text: droppedText(m) }));
    const body = el("div", { class: "panel-body" });
    const gw = el("div", { class: "gridcol" });
    const heads = el("div", { class: "heads", "aria-hidden": "true" });
    heads.style.marginLeft = "44px"; heads.style.width = GRID_W + "px";
    const stepH = m.n_heads > 16 ? 4 : 1;
    for (let h = 0; h < m.n_heads; h++) {
      if (h % stepH !== 0 && h !== m.n_heads - 1) continue;
      const s = el("span", { text: String(h + 1) }); s.style.left = ((h + 0.5) * GRID_W / m.n_heads) + "px"; heads.appendChild(s);
    }
    gw.appendChild(heads);
    const wrap = el("div", { class: "gridwrap" });
    const axis = el("div", { class: "axis", "aria-hidden": "true" });
    axis.style.height = GRID_H + "px";
    const rowH = GRID_H / m.n_layers, stepL = rowH >= 13 ? 1 : Math.ceil(13 / rowH);
    for (let l = 0; l < m.n_layers; l++) {
      if (l % stepL !== 0 && l !== m.n_layers - 1) continue;
      const s = el("span", { text: "L" + (l + 1) }); s.style.top = ((l + 0.5) * rowH) + "px"; axis.appendChild(s);
    }
    wrap.appendChild(axis);
    const grid = el("div", { class: "grid" + (filterActive() ? " filtered" : ""), role: "group",
      "aria-label": m.model + ": " + m.n_layers + " layers (rows, layer 1 at the top) by " + m.n_heads + " heads (columns), coloured by " + state.column + ". Arrow keys move, Enter opens a head's card." });
    grid.style.gridTemplateRows = "repeat(" + m.n_layers + ", 1fr)";
    grid.style.gridTemplateColumns = "repeat(" + m.n_heads + ", 1fr)";
    grid.style.height = GRID_H + "px"; grid.style.width = GRID_W + "px";
    const vals = m.values[state.column] || [];
    for (let i = 0; i < n; i++) {
      const v = vals[i] === undefined ? null : vals[i];
      const k = kindOf(m, state.column, i), kc = kindClass(k);
      const c = v === null ? null : (isEffect(k) ? sc.colour(v) : NOT_EFFECT);
      const b = el("button", { class: "cell" + (c === null ? " na" : "") + (kc ? " kind-" + kc : "") + (matches(m, i) ? " match" : ""),
        type: "button", "data-index": String(i), "data-label": m.labels[i], "data-kind": k, tabindex: i === 0 ? "0" : "-1",
        "aria-label": cellLabel(m, i, sc) });
      if (c !== null) b.style.backgroundColor = c;
      if (state.selected && state.selected.model === m.model && state.selected.i === i) b.classList.add("selected");
      b.title = m.labels[i] + ": " + fmt(v, sc.info.kind) + (k ? " (" + k + ")" : "");
      b.addEventListener("click", () => openCard(m.model, i, b));
      b.addEventListener("keydown", (ev) => moveFocus(ev, m, i, grid));
      grid.appendChild(b);
    }
    wrap.appendChild(grid);
    const depth = el("div", { class: "axis depth", "aria-hidden": "true" });
    depth.style.height = GRID_H + "px";
    [0, 0.25, 0.5, 0.75, 1].forEach((d) => { const s = el("span", { text: "— " + d.toFixed(2) }); s.style.top = (d * GRID_H) + "px"; depth.appendChild(s); });
    wrap.appendChild(depth);
    gw.appendChild(wrap);
    gw.appendChild(el("div", { class: "note", text: "right axis: relative depth (0 = input, 1 = output); both grids span the same height" }));
    body.appendChild(gw);
    body.appendChild(renderAgreement(m));
    panel.appendChild(body);
    return panel;
  }

  function moveFocus(ev, m, i, grid) {
    const H = m.n_heads, n = m.n_layers * H;
    let j = null;
    if (ev.key === "ArrowRight") j = Math.min(n - 1, i + 1);
    else if (ev.key === "ArrowLeft") j = Math.max(0, i - 1);
    else if (ev.key === "ArrowDown") j = i + H < n ? i + H : i;
    else if (ev.key === "ArrowUp") j = i - H >= 0 ? i - H : i;
    else if (ev.key === "Home") j = i - (i % H);
    else if (ev.key === "End") j = i - (i % H) + H - 1;
    if (j === null) return;
    ev.preventDefault();
    const cells = grid.querySelectorAll(".cell");
    cells[i].setAttribute("tabindex", "-1");
    cells[j].setAttribute("tabindex", "0");
    cells[j].focus();
  }

  function renderAgreement(m) {
    const side = el("div", { class: "side" });
    const t = el("table", { class: "agreement" });
    t.appendChild(el("caption", { text: "Method agreement (agreement.tsv): Spearman rho over heads [95% bootstrap CI]; top-k overlap (chance)" }));
    const head = el("tr", {}, ["methods", "rho [95% CI]", "top-k (chance)"].map((h) => el("th", { scope: "col", text: h })));
    t.appendChild(el("thead", {}, [head]));
    const tb = el("tbody", {});
    (m.agreement || []).forEach((r) => {
      const f2 = (v) => (v === null || v === undefined) ? "n/a" : v.toFixed(2);
      const rho = r.spearman === null ? "n/a" : f2(r.spearman) + " [" + f2(r.ci_low) + ", " + f2(r.ci_high) + "]";
      const topk = r.top_k_overlap === null ? "n/a" : r.top_k_overlap + "/" + r.top_k + " (" + f2(r.top_k_chance) + ")";
      tb.appendChild(el("tr", {}, [el("td", { text: r.method_a + " vs " + r.method_b }), el("td", { class: "num", text: rho }), el("td", { class: "num", text: topk })]));
    });
    if (!(m.agreement || []).length) tb.appendChild(el("tr", {}, [el("td", { colspan: "3", class: "note", text: "no agreement table (an analysis is off)" })]));
    t.appendChild(tb);
    side.appendChild(t);
    return side;
  }

  function render() {
    const sc = scale();
    renderLegend(sc);
    const panels = document.getElementById("panels");
    panels.textContent = "";
    shownModels().forEach((m) => panels.appendChild(renderPanel(m, sc)));
    if (state.selected && !document.getElementById("card").hidden) fillCard(state.selected.model, state.selected.i);
  }

  // --- the head card ---------------------------------------------------------------------
  let lastCell = null;
  function openCard(model, i, cell) {
    state.selected = { model: model, i: i };
    lastCell = cell || null;
    document.querySelectorAll(".cell.selected").forEach((c) => c.classList.remove("selected"));
    if (cell) cell.classList.add("selected");
    fillCard(model, i);
    const card = document.getElementById("card");
    card.hidden = false;
    document.getElementById("card-title").focus();
  }
  function closeCard() {
    document.getElementById("card").hidden = true;
    document.querySelectorAll(".cell.selected").forEach((c) => c.classList.remove("selected"));
    const sel = state.selected;
    state.selected = null;
    if (sel) {
      const c = document.querySelector('.panel[data-model="' + CSS.escape(sel.model) + '"] .cell[data-index="' + sel.i + '"]');
      if (c) c.focus(); else if (lastCell) lastCell.focus();
    }
  }
  function group(c) { return c.family || ("other: " + c.name.split("_")[0]); }  // the registry's family
  function droppedText(m) {
    const d = (m.examples || {}).dropped || [];
    return d.length + " example sentence" + (d.length === 1 ? "" : "s") + " left out: stored maps damaged (record" + (d.length === 1 ? " " : "s ") +
      d.join(", ") + "); the atlas_page log names the store";
  }
  // the card: roles, rank and the typical map first; the other examples and every atlas value folded (by family)
  function fillCard(model, i) {
    const m = byName[model], body = document.getElementById("card-body");
    body.textContent = "";
    document.getElementById("card-title").textContent = safe(model) + " head " + m.labels[i] + " (layer " + (Math.floor(i / m.n_heads) + 1) + ", head " + ((i % m.n_heads) + 1) + ")";
    const held = m.roles.filter((x) => x.fdr && m.values[x.fdr][i] === true).map((x) => x.role);
    body.appendChild(el("p", { class: "roles", text: "Roles held (FDR): " + (held.length ? held.join(", ") : "none") }));
    const r = rankOf(m, state.column, i), cc = colInfo(m, state.column);
    const v = cc ? m.values[cc.name][i] : null, ci = cc && cc.ci ? " [" + fmt(m.values[cc.ci[0]][i]) + ", " + fmt(m.values[cc.ci[1]][i]) + "]" : "";
    body.appendChild(el("p", { class: "rank", "data-column": state.column,
      text: "Rank on " + state.column + ": " + (r ? r.rank + " of " + r.n + " heads (1 = highest)" : "no rank (no value or not numeric)") +
        (cc ? "; value " + fmt(v, cc.kind) + ci : "") }));
    body.appendChild(renderExamples(m, i));
    body.appendChild(el("h3", { text: "Every atlas value, by family (click a family to open it)" }));
    const families = [];
    m.columns.forEach((c) => {
      if (c.ci_of || c.kinds_of) return;  // shown in the row of their column
      const g = group(c);
      let f = families.find((x) => x.name === g);
      if (!f) { f = { name: g, cols: [] }; families.push(f); }
      f.cols.push(c);
    });
    families.forEach((f) => {  // all folded: the colour column's value is in the rank line above
      const d = el("details", { class: "family", "data-family": f.name }, [el("summary", { text: f.name + " (" + f.cols.length + " value" + (f.cols.length === 1 ? "" : "s") + ")" })]);
      d.appendChild(valueTable(m, i, f.cols));
      body.appendChild(d);
    });
  }
  // three columns that fit the card (table-layout fixed): the column with what it is and its unit, the value, its CI
  function valueTable(m, i, cols) {
    const t = el("table", { class: "values" });
    t.appendChild(el("colgroup", {}, ["name", "value", "ci"].map((x) => el("col", { class: "c-" + x }))));
    t.appendChild(el("thead", {}, [el("tr", {}, ["column: what it is (unit)", "value", "CI"].map((h) => el("th", { scope: "col", text: h })))]));
    const tb = el("tbody", {});
    cols.forEach((c) => {
      const v = m.values[c.name][i];
      const ci = c.ci ? "[" + fmt(m.values[c.ci[0]][i]) + ", " + fmt(m.values[c.ci[1]][i]) + "]" : "";
      const k = c.kinds ? kindOf(m, c.name, i) : "", kc = kindClass(k);
      const name = el("th", { scope: "row" }, [el("span", { class: "name", text: c.name }), el("span", { class: "desc", text: withUnit(c) })]);
      if (k) name.appendChild(el("span", { class: "kind kind-" + (kc || "other"), text: "value: " + k + (isEffect(k) ? "" : " (not an effect)") }));
      tb.appendChild(el("tr", { "data-col": c.name, "data-kind": k, class: (c.name === state.column ? "chosen" : "") + (kc ? " kind-" + kc : "") }, [
        name,
        el("td", { class: "value" + (c.kind === "text" ? " text" : ""), "data-value": JSON.stringify(v === undefined ? null : v), text: fmt(v, c.kind) }),
        el("td", { class: "ci", text: ci }),
      ]));
    });
    t.appendChild(tb);
    return t;
  }

  function decode(b64) {
    const s = atob(b64), out = new Float32Array(s.length);
    for (let k = 0; k < s.length; k++) out[k] = s.charCodeAt(k) / 255;
    return out;
  }
  function renderExamples(m, i) {
    const ex = m.examples || {}, box = el("section", { class: "examples", "aria-label": "example attention maps" });
    box.appendChild(el("h3", { text: "Attention on example sentences (" + (ex.corpus || DATA.corpus) + ", word level)" }));
    if ((ex.dropped || []).length) box.appendChild(el("p", { class: "note dropped", text: droppedText(m) + "." }));
    const maps = (ex.maps || [])[i] || [];
    if (!maps.length) {
      box.appendChild(el("p", { class: "note", text: "No example maps for this model" + (ex.note ? ": " + ex.note : "") + "." }));
      return box;
    }
    const typ = (ex.typical || [])[i];
    const first = typ ? maps.filter((mp) => mp.s === typ.s) : [];
    const rest = maps.filter((mp) => !first.includes(mp));
    const caption = (mp) => {
      const sent = ex.sentences[mp.s];
      if (typ && mp.s === typ.s) {
        return ["Most typical of its role " + typ.role + (typ.held ? "" : " (not held under FDR: its strongest role with a score)") + ": record ",
          el("bdi", { text: sent.record_id }), ", sentence score " + fmt(typ.score)];
      }
      return ["Example: record ", el("bdi", { text: sent.record_id })];
    };
    first.forEach((mp) => box.appendChild(heatmap(ex.sentences[mp.s], decode(mp.m), caption(mp), true)));
    if (!typ) box.appendChild(el("p", { class: "note", text: "No typical sentence: " + (ex.note || "no Pande sentence score for this head") + "." }));
    const more = el("details", { class: "more-examples" }, [el("summary", { text: rest.length + " more example sentence" + (rest.length === 1 ? "" : "s") + "; how the typical one is chosen" })]);
    rest.forEach((mp) => more.appendChild(heatmap(ex.sentences[mp.s], decode(mp.m), caption(mp), false)));
    more.appendChild(el("p", { class: "note", text: DATA.typical_definition }));
    if (!typ) more.open = true;  // nothing above: the examples are the map to see
    box.appendChild(more);
    return box;
  }
  function heatmap(sent, vals, title, typical) {
    const units = sent.units, U = units.length;
    const fig = el("figure", { class: "example" + (typical ? " typical" : "") });
    fig.appendChild(el("figcaption", {}, title));
    // axis labels: a word cut to 40 characters, the margins as wide as the longest label needs (11 px text)
    const label = (u) => u.length > 40 ? u.slice(0, 39) + "…" : u;
    const longest = Math.max(...units.map((u) => label(u).length));
    const c = Math.max(9, Math.min(18, Math.floor(380 / U))), left = 12 + Math.ceil(6.2 * longest), top = 14 + Math.ceil(5.4 * longest);
    const w = left + U * c + 70, h = top + U * c + 4;
    // top links for the text summary (and screen readers)
    const links = [];
    for (let a = 0; a < U; a++) for (let b = 0; b < U; b++) links.push([vals[a * U + b], a, b]);
    links.sort((x, y) => y[0] - x[0]);
    const top5 = links.slice(0, 5);
    const summary = top5.map((x) => units[x[1]] + " → " + units[x[2]] + " " + x[0].toFixed(2)).join("; ");
    const svg = svgEl("svg", { width: w, height: h, viewBox: "0 0 " + w + " " + h, role: "img",
      "aria-label": "word-level attention map of \u201c" + units.join(" ") + "\u201d; rows attend from, columns attend to; strongest: " + summary });
    for (let a = 0; a < U; a++) {
      const t = svgEl("text", { x: left - 4, y: top + a * c + c * 0.75, "text-anchor": "end" });
      t.textContent = label(units[a]); svg.appendChild(t);
      const t2 = svgEl("text", { transform: "translate(" + (left + a * c + c * 0.7) + "," + (top - 4) + ") rotate(-60)" });
      t2.textContent = label(units[a]); svg.appendChild(t2);
    }
    for (let a = 0; a < U; a++) for (let b = 0; b < U; b++) {
      const v = vals[a * U + b];
      const r = svgEl("rect", { x: left + b * c, y: top + a * c, width: c - 0.5, height: c - 0.5, fill: lerpColour(["#ffffff", "#c6dbef", "#6baed6", "#2171b5", "#08306b"], v) });
      const tt = svgEl("title", {}); tt.textContent = units[a] + " → " + units[b] + ": " + v.toFixed(2); r.appendChild(tt);
      svg.appendChild(r);
    }
    fig.appendChild(svg);
    // each word isolated (<bdi>): a right-to-left word does not reorder the text around it
    const strongest = [];
    top5.forEach((x, j) => strongest.push(j ? "; " : "", el("bdi", { text: units[x[1]] }), " → ", el("bdi", { text: units[x[2]] }), " " + x[0].toFixed(2)));
    fig.appendChild(el("p", { class: "links" }, ["Rows attend from, columns to; white 0 to dark blue 1 (word-level attention, rows sum to 1). Strongest: "].concat(strongest)));
    return fig;
  }

  // --- controls --------------------------------------------------------------------------
  function option(value, text, selected) { const o = el("option", { value: value, text: text }); if (selected) o.selected = true; return o; }
  function buildControls() {
    const ctl = document.getElementById("controls");
    const selA = el("select", { id: "model-a" }, MODELS.map((m) => option(m.model, m.model, m.model === state.a)));
    const selB = el("select", { id: "model-b" }, [option("", "(none)", state.b === "")].concat(MODELS.map((m) => option(m.model, m.model, m.model === state.b))));
    const cols = allColumns();
    if (!state.column && cols.length) state.column = (cols.find((c) => c.kind === "number") || cols[0]).name;
    const groups = {};
    cols.forEach((c) => { const g = group(c); (groups[g] = groups[g] || []).push(c); });
    const selC = el("select", { id: "colour-by" }, Object.keys(groups).map((g) => el("optgroup", { label: g }, groups[g].map((c) => option(c.name, c.name, c.name === state.column)))));
    const roles = [];
    MODELS.forEach((m) => m.roles.forEach((r) => { if (roles.indexOf(r.role) < 0) roles.push(r.role); }));
    const selR = el("select", { id: "role-filter" }, [option("", "(any head)", true)].concat(roles.map((r) => option(r, r, false))));
    const selM = el("select", { id: "role-mode" }, [option("fdr", "FDR", true), option("faithful", "faithful (uncorrected)", false)]);
    const selOp = el("select", { id: "threshold-op" }, [option(">=", "≥", true), option("<=", "≤", false)]);
    const inp = el("input", { id: "threshold", type: "number", step: "any", placeholder: "none" });
    const kvs = [];
    // only models whose query heads share key/value heads (grouped-query attention) are offered a KV-group filter
    MODELS.filter((m) => m.kv_shared).forEach((m) => (m.values.det_kv_group || []).forEach((v) => { if (v !== null && kvs.indexOf(String(v)) < 0) kvs.push(String(v)); }));
    const selK = el("select", { id: "kv-filter" }, [option("", kvs.length ? "(any)" : "(no shared key/value heads)", true)].concat(kvs.map((v) => option(v, v, false))));
    if (!kvs.length) selK.disabled = true;
    const reset = el("button", { id: "reset", type: "button", text: "Clear filters" });
    const lab = (text, ctrl) => el("label", {}, [text, ctrl]);
    ctl.appendChild(lab("Model (left)", selA));
    ctl.appendChild(lab("Model (right)", selB));
    ctl.appendChild(lab("Colour heads by (any numeric atlas column)", selC));
    ctl.appendChild(el("fieldset", {}, [el("legend", { text: "Highlight heads that" }),
      lab("hold the role", selR), lab("under", selM), lab("have the colour column", selOp), lab("threshold", inp), lab("KV group", selK), reset]));
    selA.addEventListener("change", () => { state.a = selA.value; render(); });
    selB.addEventListener("change", () => { state.b = selB.value; render(); });
    selC.addEventListener("change", () => { state.column = selC.value; render(); });
    selR.addEventListener("change", () => { state.role = selR.value; render(); });
    selM.addEventListener("change", () => { state.mode = selM.value; render(); });
    selOp.addEventListener("change", () => { state.op = selOp.value; render(); });
    inp.addEventListener("input", () => { state.threshold = inp.value.trim(); render(); });
    selK.addEventListener("change", () => { state.kv = selK.value; render(); });
    reset.addEventListener("click", () => { state.role = ""; state.threshold = ""; state.kv = ""; selR.value = ""; inp.value = ""; selK.value = ""; render(); });
  }

  function build() {
    document.body.appendChild(el("h1", { text: DATA.title }));
    document.body.appendChild(el("p", { class: "intro", text: "Every head of every model of this run, one cell each: layers are rows (layer 1 at the top), " +
      "heads are columns (head 1 at the left); heads are named 1-based layer-head. Pick the column that colours the cells, highlight heads " +
      "by role, threshold or KV group, and click a head (or press Enter on it) for its card: every atlas value with its CI, its rank, and its " +
      "attention on example sentences of " + DATA.corpus + ". The two models are drawn at the same height, so rows at the same height " +
      "lie at the same relative depth." }));
    document.body.appendChild(el("div", { id: "controls", class: "controls", role: "region", "aria-label": "controls" }));
    document.body.appendChild(el("div", { id: "legend", class: "legend", role: "region", "aria-label": "colour legend" }));
    document.body.appendChild(el("main", { id: "panels", class: "panels" }));
    const card = el("section", { id: "card", role: "dialog", "aria-labelledby": "card-title", tabindex: "-1", hidden: "" }, [
      el("button", { class: "close", type: "button", id: "card-close", text: "Close (Esc)" }),
      el("h2", { id: "card-title", tabindex: "-1" }),
      el("div", { id: "card-body" }),
    ]);
    document.body.appendChild(card);
    document.getElementById("card-close").addEventListener("click", closeCard);
    document.addEventListener("keydown", (ev) => { if (ev.key === "Escape" && !card.hidden) closeCard(); });
    if (!MODELS.length) { document.body.appendChild(el("p", { text: "This run has no atlas." })); return; }
    buildControls();
    render();
  }
  build();
})();
