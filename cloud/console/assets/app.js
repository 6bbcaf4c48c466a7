// Atoll status page: follows /ui/api/events (server-sent events) and
// re-renders only the units each delta names. No framework, no build.
"use strict";
(function () {
  const units = new Map();     // name → unit (the server's JSON)
  const tiles = new Map();     // name → tile element
  const collapsed = new Map(); // name → bool (the operator's choice)
  let selected = null;         // selected node name
  let filter = "";
  let many = false;            // thousands of nodes: healthy units start collapsed
  const $ = (id) => document.getElementById(id);
  const unitsEl = $("units"), timelineEl = $("timeline"), detailEl = $("detail"), tunnelsEl = $("tunnels");

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === "class") e.className = attrs[k];
      else if (k.startsWith("data-") || k === "id" || k === "title") e.setAttribute(k, attrs[k]);
      else e[k] = attrs[k];
    }
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const short = (h) => (h || "").slice(0, 10);
  const clock = (t) => (t ? new Date(t).toLocaleTimeString() : "");

  // matches tells whether the filter keeps unit u (all: every node) or
  // which of its nodes it keeps.
  function matches(u) {
    if (!filter) return { all: true };
    if (u.name.toLowerCase().includes(filter) || u.disruption.toLowerCase() === filter) return { all: true };
    const nodes = new Set(u.nodes.filter((n) => n.name.toLowerCase().includes(filter) || n.state === filter ||
      (filter === "link-down" && n.link === "down")).map((n) => n.name));
    return { all: false, nodes };
  }

  function isCollapsed(u) {
    if (collapsed.has(u.name)) return collapsed.get(u.name);
    return many && u.nodes.every((n) => n.state === "healthy");
  }

  function renderUnit(u) {
    const counts = { healthy: 0, protected: 0, unhealthy: 0, unknown: 0 };
    u.nodes.forEach((n) => counts[n.state]++);
    const m = matches(u);
    const coll = isCollapsed(u);
    const tile = el("div", { class: "unit", "data-unit": u.name, "data-disruption": u.disruption,
      "data-collapsed": String(coll) });
    if (!m.all && m.nodes.size === 0) tile.classList.add("hidden");
    const h = el("h3", {});
    h.append(el("span", { class: "toggle" }, coll ? "▸" : "▾"), el("span", { class: "name" }, u.name),
      el("span", { class: "disruption", "data-testid": "disruption" }, u.disruption + (u.holdUntil ? " · held until " + clock(u.holdUntil) : "")));
    const c = el("span", { class: "counts" });
    for (const s of ["healthy", "protected", "unhealthy", "unknown"]) {
      if (counts[s]) c.append(el("span", { class: "node labelled", "data-state": s, title: s }, String(counts[s])), " ");
    }
    h.append(c);
    h.addEventListener("click", () => { collapsed.set(u.name, !isCollapsed(u)); replace(u); });
    tile.append(h);
    if (!coll) { // a collapsed unit renders no node cells at all
      const body = el("div", { class: "body" });
      const nodes = el("div", { class: "nodes" });
      for (const n of u.nodes) {
        if (!m.all && !m.nodes.has(n.name)) continue;
        const cell = el("span", { class: "node", "data-node": n.name, "data-state": n.state, "data-link": n.link,
          title: `${n.name}: ${n.state} (Ready=${n.ready || "?"}, peers: ${n.verdict}, link ${n.link})` });
        if (n.link === "down") cell.classList.add("link-down");
        if (n.name === selected) cell.classList.add("selected");
        if (n.state !== "healthy") { // the nodes to look at carry their name
          cell.classList.add("labelled");
          cell.textContent = n.name + " · " + n.state;
        }
        if (n.tunnels) cell.append(el("span", { class: "tag" }, " ⇄" + n.tunnels));
        cell.addEventListener("click", (ev) => { ev.stopPropagation(); select(n.name); });
        nodes.append(cell);
      }
      body.append(nodes);
      if (u.grids && u.grids.length) {
        const g = el("div", { class: "grids" });
        for (const gu of u.grids) {
          const current = gu.current;
          const row = el("div", { class: "grid-row", "data-grid": gu.grid, "data-unit": u.name,
            "data-revision": gu.revision, "data-rollout": gu.rollout || "", "data-current": String(current),
            "data-ready": String(gu.ready), "data-phase": gu.phase || "" });
          row.append(el("span", {}, gu.grid.replace(/^[^/]*\//, "")),
            el("span", { class: "rev", title: "template revision of the unit's child" + (gu.rollout ? "; rollout " + gu.rollout : "") },
              short(gu.revision) + (current ? " (new)" : " (old)")),
            el("span", {}, `${gu.readyReplicas}/${gu.replicas} ready`),
            el("span", { class: "phase" }, (gu.phase || "") + (gu.position ? ` ${gu.position}/${gu.of}` : "")));
          g.append(row);
        }
        body.append(g);
      }
      tile.append(body);
    }
    return tile;
  }

  // replace renders u into its tile, in name order.
  function replace(u) {
    const tile = renderUnit(u);
    const old = tiles.get(u.name);
    if (old) old.replaceWith(tile);
    else {
      let before = null; // the first tile after u by name
      for (const [name, t] of tiles) if (name > u.name && (!before || name < before.dataset.unit)) before = t;
      unitsEl.insertBefore(tile, before);
    }
    tiles.set(u.name, tile);
  }

  function remove(name) {
    const t = tiles.get(name);
    if (t) t.remove();
    tiles.delete(name);
    units.delete(name);
  }

  function findNode(name) {
    for (const u of units.values()) for (const n of u.nodes) if (n.name === name) return [u, n];
    return [null, null];
  }

  function select(name) {
    const prev = selected;
    selected = name;
    for (const nm of [prev, name]) { const [u] = findNode(nm); if (u) replace(u); }
    renderDetail();
  }

  function renderDetail() {
    const [u, n] = findNode(selected);
    detailEl.replaceChildren(el("h2", {}, "Node"));
    if (!n) { detailEl.append(el("p", { class: "muted" }, "Click a node.")); return; }
    detailEl.setAttribute("data-node", n.name);
    detailEl.setAttribute("data-state", n.state);
    const badge = el("span", { class: "badge node labelled", "data-state": n.state }, n.state);
    detailEl.append(el("p", {}, n.name + " in unit " + u.name + " "), badge);
    const t = el("table", {});
    const row = (k, v) => { const r = el("tr", {}); r.append(el("th", {}, k), el("td", {}, v)); t.append(r); };
    row("Kubernetes Ready", n.ready || "(none)");
    row("Peers' verdict", n.verdict);
    row("Protected", n.protected ? "yes: Atoll keeps the node, its pods and endpoints" : "no");
    row("Leaf link", n.link);
    row("Tunnel sessions", String(n.tunnels || 0));
    const refusals = n.probeRefusals || [];
    if (refusals.length) { // a configuration error of the agent's kubelet token
      row("Probe credentials", refusals.map((r) => (refusals.length > 1 ? r.plugin + " " : "") +
        `refused by ${r.peer} (${r.status})`).join(", ") + ": fix atoll-edge's --kubelet-token-file (get nodes/healthz)");
      t.lastChild.dataset.testid = "probe-credentials";
    }
    if (n.noKey) { // the registry lost it, or the node is revoked
      row("Identity key", "none recorded by the cloud: its peers drop its reports (recorded again at its next renewal, unless revoked)");
      t.lastChild.dataset.testid = "no-key";
    }
    detailEl.append(t);
    detailEl.append(el("h2", {}, "Votes"));
    if (!n.votes || !n.votes.length) { detailEl.append(el("p", { class: "muted" }, "No fresh vote.")); return; }
    const vt = el("table", { id: "votes" });
    const hr = el("tr", {});
    hr.append(el("th", {}, "voter"), el("th", {}, "verdict"), el("th", {}, "made (voter)"), el("th", {}, "stored (hub)"));
    vt.append(hr);
    for (const v of n.votes) {
      const r = el("tr", { "data-voter": v.voter, "data-verdict": v.verdict });
      r.append(el("td", {}, v.voter), el("td", {}, v.verdict), el("td", {}, clock(v.made)), el("td", {}, clock(v.stored)));
      vt.append(r);
    }
    detailEl.append(vt);
  }

  function renderTunnels() {
    const items = [];
    for (const u of units.values()) for (const n of u.nodes) if (n.tunnels) items.push([n.name, n.tunnels, u.name]);
    tunnelsEl.replaceChildren(...(items.length ? items.map(([n, c, u]) => el("li", { "data-node": n, "data-tunnels": String(c) }, `${n} (${u}): ${c}`))
      : [el("li", { class: "muted" }, "none open")]));
  }

  function addTimeline(entries) {
    for (const e of entries) {
      const li = el("li", { "data-kind": e.kind, "data-node": e.node || "", "data-unit": e.unit });
      li.append(el("time", {}, clock(e.time)),
        document.createTextNode(e.kind === "write" ? e.detail :
          `${e.node || e.unit}: ${e.kind} ${e.from} → ${e.to}` + (e.detail ? ` (${e.detail})` : "")));
      timelineEl.prepend(li);
    }
    while (timelineEl.children.length > 500) timelineEl.lastChild.remove();
  }

  function summary() {
    const c = { healthy: 0, protected: 0, unhealthy: 0, unknown: 0 };
    let n = 0;
    for (const u of units.values()) for (const x of u.nodes) { c[x.state]++; n++; }
    $("summary").textContent = `${units.size} units · ${n} nodes · ${c.healthy} healthy · ${c.protected} protected · ${c.unhealthy} unhealthy · ${c.unknown} unknown`;
  }

  function apply(m, snapshot) {
    if (snapshot) {
      for (const name of [...tiles.keys()]) remove(name);
      timelineEl.replaceChildren();
      let total = 0;
      for (const u of m.units) total += u.nodes.length;
      many = total > 2000;
    }
    for (const u of m.units) { units.set(u.name, u); replace(u); }
    for (const name of m.removed || []) remove(name);
    addTimeline(m.timeline || []);
    if (selected) renderDetail();
    renderTunnels();
    summary();
    document.body.dataset.seq = String(m.seq);
  }

  function connect() {
    const es = new EventSource("api/events");
    es.addEventListener("open", () => { $("conn").dataset.conn = "live"; $("conn").textContent = "live"; });
    es.addEventListener("error", () => { $("conn").dataset.conn = "lost"; $("conn").textContent = "reconnecting"; });
    es.addEventListener("snapshot", (ev) => apply(JSON.parse(ev.data), true));
    es.addEventListener("delta", (ev) => apply(JSON.parse(ev.data), false));
  }

  let pending = null;
  $("filter").addEventListener("input", (ev) => {
    clearTimeout(pending);
    pending = setTimeout(() => { filter = ev.target.value.trim().toLowerCase(); for (const u of units.values()) replace(u); }, 150);
  });
  $("collapse-all").addEventListener("click", () => { for (const u of units.values()) { collapsed.set(u.name, true); replace(u); } });
  $("expand-all").addEventListener("click", () => { for (const u of units.values()) { collapsed.set(u.name, false); replace(u); } });
  connect();
})();
