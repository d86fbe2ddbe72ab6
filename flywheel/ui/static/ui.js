// Flywheel's web view: keeps each page live by polling the server every few seconds.
(function () {
  "use strict";
  var prefix = document.body.dataset.prefix || "/ui";
  var EVERY_MS = 5000;
  var live = document.getElementById("live");

  function mark(ok) { if (live) { live.classList.toggle("stale", !ok); live.textContent = ok ? "live" : "not updating"; } }

  function poll(fn) { setInterval(function () { fn().then(function () { mark(true); }, function () { mark(false); }); }, EVERY_MS); }

  function get(url, asJson) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: asJson ? "application/json" : "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return asJson ? r.json() : r.text(); });
  }

  // the episode list: its rows again, same filters and page
  var rows = document.getElementById("rows");
  if (rows && rows.dataset.refresh) {
    poll(function () { return get(rows.dataset.refresh, false).then(function (html) { rows.innerHTML = html; }); });
  }

  // an episode: reload when it has new events
  var episode = document.getElementById("episode");
  if (episode) {
    poll(function () {
      return get(prefix + "/api/episodes/" + encodeURIComponent(episode.dataset.episode) + "/last", true)
        .then(function (d) { if (d.last !== episode.dataset.last) { location.reload(); } });
    });
  }

  // the training page: one Chart.js chart per canvas, updated in place
  var chartsEl = document.getElementById("charts");
  if (chartsEl && window.Chart) {
    var COLOURS = ["#1e88e5", "#43a047", "#e53935", "#8e24aa", "#fb8c00", "#00897b"];
    var charts = {};
    var draw = function (data) {
      Object.keys(data.charts).forEach(function (id) {
        var spec = data.charts[id];
        var canvas = document.getElementById("chart-" + id);
        if (!canvas) { return; }
        var datasets = Object.keys(spec.series).map(function (label, i) {
          return { label: label, data: spec.series[label], borderColor: COLOURS[i % COLOURS.length],
                   backgroundColor: COLOURS[i % COLOURS.length], spanGaps: true, pointRadius: 2 };
        });
        var chart = charts[id];
        if (chart) {
          chart.data.labels = spec.labels; chart.data.datasets = datasets; chart.update("none");
          return;
        }
        charts[id] = new window.Chart(canvas, {
          type: spec.bar || spec.stacked ? "bar" : "line",
          data: { labels: spec.labels, datasets: datasets },
          options: { animation: false, responsive: true, interaction: { mode: "index", intersect: false },
                     scales: { x: { stacked: !!spec.stacked, title: { display: true, text: id === "versions" ? "weight version" : (id === "time" ? "time (UTC)" : (id === "tenants" ? "tenant" : "trainer step")) } },
                               y: { stacked: !!spec.stacked } } }
        });
      });
      chartsEl.dataset.steps = String(data.steps.length);
    };
    var load = function () { return get(prefix + "/api/training?bucket=" + encodeURIComponent(chartsEl.dataset.bucket), true).then(draw); };
    load().then(function () { mark(true); }, function () { mark(false); });
    poll(load);
  }
})();
