// Orderly console: refresh the parts of a page marked data-refresh every data-every seconds.
// The pages work without it; it only saves the reload. The next refresh is timed from the end of
// the last one, so a slow answer (a large history) is never asked for again while it is computed;
// one not answered within 30 s (a connection lost in a laptop's sleep) is given up, not waited for.
(function () {
  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    var url = el.getAttribute("data-refresh"), every = Number(el.getAttribute("data-every") || 5) * 1000;
    function later() { setTimeout(refresh, every); }
    function refresh() {
      if (document.hidden) { later(); return; }
      var abort = new AbortController(), giveUp = setTimeout(function () { abort.abort(); }, Math.max(every, 30000));
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" }, signal: abort.signal })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) el.innerHTML = html; })
        .catch(function () {})
        .then(function () { clearTimeout(giveUp); later(); });
    }
    later();
  });
})();
