// Orderly console: refresh the parts of a page marked data-refresh every data-every seconds.
// The pages work without it; it only saves the reload.
(function () {
  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    var url = el.getAttribute("data-refresh"), every = Number(el.getAttribute("data-every") || 5) * 1000;
    setInterval(function () {
      if (document.hidden) return;
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) el.innerHTML = html; })
        .catch(function () {});
    }, every);
  });
})();
