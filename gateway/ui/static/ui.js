// The status page's only script (no build step): every few seconds it fetches /ui/data, swaps in
// each team's server-rendered summary and draws the team's charts with uPlot (vendored beside it).
// Each chart's container carries data-points (values drawn, empty buckets left out) for the tests.
(function () {
  "use strict";
  const root = document.getElementById("teams");
  const refreshMs = Number(root.dataset.refreshMs) || 5000;
  const colors = ["#2b6cb0", "#d97706", "#c53030", "#2f855a"];
  const charts = new Map(); // chart id -> {el, names, plot}

  function section(team) {
    for (const found of root.querySelectorAll("section.team")) {
      if (found.dataset.team === team) return found;
    }
    const created = document.createElement("section");
    created.className = "team";
    created.dataset.team = team;
    const title = document.createElement("h2");
    title.textContent = team;
    const summary = document.createElement("div");
    summary.className = "summary";
    const grid = document.createElement("div");
    grid.className = "charts";
    created.append(title, summary, grid);
    const note = root.querySelector(":scope > p.note");
    if (note) note.remove();
    root.appendChild(created);
    return created;
  }

  function row(grid, group) {
    for (const found of grid.children) {
      if (found.dataset.group === group) return found;
    }
    const created = document.createElement("div");
    created.className = "chart-row";
    created.dataset.group = group;
    grid.appendChild(created);
    return created;
  }

  function draw(grid, spec, times) {
    const names = Object.keys(spec.series);
    const data = [times, ...names.map((name) => spec.series[name])];
    const parent = row(grid, spec.group);
    let chart = charts.get(spec.id);
    if (chart && (chart.names.join("\n") !== names.join("\n") || chart.el.parentNode !== parent)) {
      chart.plot.destroy();
      chart.el.remove();
      charts.delete(spec.id);
      chart = undefined;
    }
    if (!chart) {
      const el = document.createElement("div");
      el.className = "chart";
      el.dataset.chart = spec.id;
      el.dataset.kind = spec.kind;
      const title = document.createElement("h4");
      title.textContent = spec.title + " (" + spec.unit + ")";
      el.appendChild(title);
      parent.appendChild(el);
      const options = {
        width: 340,
        height: 150,
        scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
        axes: [{ size: 30 }, { size: 48 }],
        legend: { live: false },
        series: [{}, ...names.map((name, i) => ({
          label: name, stroke: colors[i % colors.length], width: 1.5, points: { show: true, size: 4 },
          dash: spec.dashed.includes(name) ? [5, 4] : undefined,
        }))],
      };
      chart = { el, names, plot: new uPlot(options, data, el) };
      charts.set(spec.id, chart);
    } else {
      chart.plot.setData(data);
    }
    chart.el.dataset.points = String(data.slice(1).reduce((n, s) => n + s.filter((v) => v !== null).length, 0));
  }

  function render(status) {
    document.getElementById("updated").textContent = new Date(status.generated_at * 1000).toLocaleTimeString();
    const seen = new Set();
    for (const team of status.teams) {
      const found = section(team.team);
      found.querySelector(".summary").innerHTML = team.summary_html; // rendered and escaped by the server
      const grid = found.querySelector(".charts");
      for (const spec of team.charts) {
        seen.add(spec.id);
        draw(grid, spec, status.times);
      }
    }
    for (const [id, chart] of charts) {
      if (!seen.has(id)) {
        chart.plot.destroy();
        chart.el.remove();
        charts.delete(id);
      }
    }
    for (const empty of root.querySelectorAll(".chart-row:empty")) empty.remove();
    root.dataset.rendered = String(Number(root.dataset.rendered || 0) + 1);
  }

  async function refresh() {
    let response;
    try {
      response = await fetch("/ui/data", { credentials: "same-origin", cache: "no-store" });
    } catch (error) {
      document.getElementById("updated").textContent = "unreachable (" + new Date().toLocaleTimeString() + ")";
      return;
    }
    if (response.status === 401 || response.status === 403) {
      window.location.reload(); // the session ended: the page offers the login form again
      return;
    }
    if (response.ok) render(await response.json());
  }

  refresh();
  setInterval(refresh, refreshMs);
})();
