// The review page's one script: it shows times in the browser's own time
// zone. The page works without it; the edge writes times in the tenant's
// zone (EDGE_REVIEW_TIMEZONE) and this only rewrites them.
(function () {
  "use strict";
  var fmt = new Intl.DateTimeFormat(undefined, {
    weekday: "short", day: "numeric", month: "short",
    hour: "2-digit", minute: "2-digit", timeZoneName: "short"
  });
  var times = document.querySelectorAll("time[data-local]");
  for (var i = 0; i < times.length; i++) {
    var t = times[i];
    var d = new Date(t.getAttribute("datetime"));
    if (!isNaN(d.getTime())) {
      t.title = t.textContent;
      t.textContent = fmt.format(d);
      t.setAttribute("data-local", "browser");
    }
  }
})();
