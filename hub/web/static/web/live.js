// The dashboard's live updates: one WebSocket per page (hub/web/consumers.py) sends the
// signed-in person's lease and host states; this refreshes the fragments that show them.
// Fragments opt in with data-live-lease="<id>" or data-live-host="<id>" and an hx-get plus
// hx-trigger="cloudgpu:refresh", or data-live-hosts with hx-trigger="cloudgpu:refresh-list";
// state badges with data-lease-badge="<id>".
// A panel with data-live-logs="<lease id>" follows that lease's live output into its <pre>.
// Every <time data-since="ISO"> counts on by itself ("3 min ago"), also between refreshes;
// the words match the server's (hub/lib/timewords.py).
(function () {
  "use strict";
  function ago(seconds) {
    if (seconds < 5) return "just now";
    if (seconds < 60) return seconds + " s ago";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    if (seconds < 86400) {
      return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min ago";
    }
    var days = Math.floor(seconds / 86400);
    return days + (days === 1 ? " day ago" : " days ago");
  }
  // The page's own clock may be off: count from the server's time when the page was made.
  var served = Date.parse(document.body.getAttribute("data-server-now") || "");
  var skew = isNaN(served) ? 0 : served - Date.now();
  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll("time[data-since]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("data-since"));
      if (!isNaN(at)) el.textContent = ago(Math.max(0, Math.floor((now - at) / 1000)));
    });
  }
  tick();
  setInterval(tick, 5000);
  document.body.addEventListener("htmx:afterSwap", tick);
})();

(function () {
  "use strict";
  var path = document.body.getAttribute("data-live");
  if (!path || !window.WebSocket) return;
  var previous = null;
  var retryMs = 1000;
  var dot = document.getElementById("live-dot");
  var socket = null;
  var logsPanel = document.querySelector("[data-live-logs]");
  var logsLease = logsPanel ? logsPanel.getAttribute("data-live-logs") : null;
  var logPre = logsPanel ? logsPanel.querySelector("pre") : null;
  var MAX_LOG_CHARS = 200000;

  function subscribeLogs() {
    if (logsLease && socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "logs.subscribe", lease_id: logsLease }));
    }
  }

  function showLog(message) {
    if (!logPre || message.lease_id !== logsLease) return;
    var atBottom = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 8;
    var text = (message.backlog ? "" : logPre.textContent) + message.data;
    if (text.length > MAX_LOG_CHARS) text = text.slice(text.length - MAX_LOG_CHARS);
    logPre.textContent = text;
    if (atBottom) logPre.scrollTop = logPre.scrollHeight;
    var note = document.getElementById("live-log-note");
    if (note && text) note.hidden = true;
  }

  // The hosts list holds each host's fragment, and events bubble: the list listens for an
  // event of its own, or every host's refresh would also swap the whole list (and its forms).
  function refresh(selector, event) {
    document.querySelectorAll(selector).forEach(function (el) {
      if (window.htmx) window.htmx.trigger(el, event || "cloudgpu:refresh");
    });
  }

  function apply(snapshot) {
    var first = previous === null;
    var old = previous || { leases: {}, hosts: {} };
    Object.keys(snapshot.leases).forEach(function (id) {
      var lease = snapshot.leases[id];
      document.querySelectorAll('[data-lease-badge="' + id + '"]').forEach(function (el) {
        el.textContent = lease.state;
        el.setAttribute("data-state", lease.state);
      });
      // The first picture may already differ from what the page was rendered with.
      if (first || !old.leases[id] || old.leases[id].sig !== lease.sig) {
        refresh('[data-live-lease="' + id + '"]');
      }
      var was = old.leases[id] ? old.leases[id].state : null;
      // Once over, the refreshed panel shows the output kept (or says why there is none):
      // the live panel would only repeat it, or contradict it.
      if (id === logsLease && (lease.state === "ended" || lease.state === "failed") && logsPanel) {
        logsPanel.hidden = true;
      }
      if (id === logsLease && lease.state === "running" && was !== "running") subscribeLogs();
    });
    // The whole hosts list is swapped only when the set of hosts differs from what the page
    // shows: its forms (a host's name, a GPU's price) would lose what someone is typing.
    var shown = [];
    document.querySelectorAll("[data-live-host]").forEach(function (el) {
      shown.push(el.getAttribute("data-live-host"));
    });
    var newIds = Object.keys(snapshot.hosts).sort().join(",");
    if (document.querySelector("[data-live-hosts]") && shown.sort().join(",") !== newIds) {
      refresh("[data-live-hosts]", "cloudgpu:refresh-list");
    } else {
      Object.keys(snapshot.hosts).forEach(function (id) {
        if (first || !old.hosts[id] || old.hosts[id].sig !== snapshot.hosts[id].sig) {
          refresh('[data-live-host="' + id + '"]');
        }
      });
    }
    previous = snapshot;
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + path);
    socket.onopen = function () {
      retryMs = 1000;
      subscribeLogs();
      if (dot) { dot.classList.add("on"); dot.title = "live updates on"; }
    };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type === "snapshot") apply(message);
      else if (message.type === "log") showLog(message);
    };
    socket.onclose = function () {
      if (dot) { dot.classList.remove("on"); dot.title = "live updates reconnecting"; }
      previous = null;
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }
  connect();
})();
