// The lease page's terminal: xterm.js (vendored) over /ws/leases/<id>/terminal/
// (hub/leases/terminal_socket.py). Keystrokes go out as {"type": "input"}, window sizes as
// {"type": "resize"}; output comes back as {"type": "output"} and the end as {"type": "exit"}.
// Every few seconds a {"type": "ping"} goes to the host's agent and back as {"type": "pong"}:
// the round trip shown next to the status (what each keystroke's echo costs at least).
(function () {
  "use strict";
  var box = document.getElementById("terminal");
  var status = document.getElementById("terminal-status");
  var latency = document.getElementById("terminal-latency");
  var PING_EVERY_MS = 5000;
  var pings = {};
  var pingCount = 0;
  var pinger = null;
  if (!box || !window.Terminal || !window.WebSocket) return;
  var lease = box.getAttribute("data-terminal-lease");
  var term = new window.Terminal({ cursorBlink: true, convertEol: false, scrollback: 5000 });
  var fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
  var url = scheme + window.location.host + "/ws/leases/" + lease + "/terminal/?cols=" +
    term.cols + "&rows=" + term.rows;
  var socket = new WebSocket(url);
  var ended = false;

  function say(text) { status.textContent = text; }
  function send(message) {
    if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function ping() {
    if (Object.keys(pings).length > 10) pings = {}; // a host that stopped answering
    pingCount += 1;
    var nonce = String(pingCount);
    pings[nonce] = performance.now();
    send({ type: "ping", nonce: nonce });
  }

  socket.onopen = function () {
    say("Connected.");
    term.focus();
    ping();
    pinger = window.setInterval(ping, PING_EVERY_MS);
  };
  socket.onmessage = function (event) {
    var message;
    try { message = JSON.parse(event.data); } catch (e) { return; }
    if (message.type === "output") {
      term.write(message.data);
    } else if (message.type === "pong") {
      var sent = pings[message.nonce];
      if (sent === undefined || !latency) return;
      pings = {};
      var ms = performance.now() - sent;
      latency.textContent = "· round trip to the host " + (ms < 10 ? ms.toFixed(1) : Math.round(ms)) + " ms";
    } else if (message.type === "exit") {
      ended = true;
      if (pinger !== null) window.clearInterval(pinger);
      if (message.error) {
        say("Session ended: " + message.error);
      } else {
        say("Session ended (exit code " + message.exit_code + "). Reload the page for a new one.");
      }
      box.setAttribute("data-exit-code", String(message.exit_code));
    }
  };
  socket.onclose = function () {
    if (pinger !== null) window.clearInterval(pinger);
    if (latency) latency.textContent = "";
    if (!ended) say("Disconnected. Reload the page for a new session.");
  };
  term.onData(function (data) { send({ type: "input", data: data }); });
  term.onResize(function (size) { send({ type: "resize", cols: size.cols, rows: size.rows }); });
  window.addEventListener("resize", function () { fit.fit(); });
})();
