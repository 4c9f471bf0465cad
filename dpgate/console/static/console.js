// dpgate console: draw each chart of the page from its embedded Vega-Lite specification (vega-embed;
// ast: true evaluates Vega expressions with the interpreter, so the page's CSP needs no 'unsafe-eval').
// <body data-rendered> is set to the number of charts drawn, which the browser tests wait for.
(function () {
  const charts = document.querySelectorAll('script[type="application/json"][data-chart]');
  window.dpgateViews = {};
  let done = 0;
  charts.forEach(function (el) {
    const name = el.dataset.chart;
    vegaEmbed('#chart-' + name, JSON.parse(el.textContent), {actions: false, renderer: el.dataset.renderer, ast: true})
      .then(function (result) { window.dpgateViews[name] = result.view; })
      .catch(function (err) { document.getElementById('chart-' + name).textContent = 'chart error: ' + err; })
      .finally(function () { done += 1; if (done === charts.length) document.body.dataset.rendered = done; });
  });
  if (!charts.length) document.body.dataset.rendered = 0;
})();
