// The lease page's terminal: xterm.js (vendored) over /ws/leases/<id>/terminal/
// (hub/leases/terminal_socket.py). Keystrokes go out as {"type": "input"}, window sizes as
// {"type": "resize"}; output comes back as {"type": "output"} and the end as {"type": "exit"}.
(function () {
  "use strict";
  var box = document.getElementById("terminal");
  var status = document.getElementById("terminal-status");
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

  socket.onopen = function () { say("Connected."); term.focus(); };
  socket.onmessage = function (event) {
    var message;
    try { message = JSON.parse(event.data); } catch (e) { return; }
    if (message.type === "output") {
      term.write(message.data);
    } else if (message.type === "exit") {
      ended = true;
      if (message.error) {
        say("Session ended: " + message.error);
      } else {
        say("Session ended (exit code " + message.exit_code + "). Reload the page for a new one.");
      }
      box.setAttribute("data-exit-code", String(message.exit_code));
    }
  };
  socket.onclose = function () {
    if (!ended) say("Disconnected. Reload the page for a new session.");
  };
  term.onData(function (data) { send({ type: "input", data: data }); });
  term.onResize(function (size) { send({ type: "resize", cols: size.cols, rows: size.rows }); });
  window.addEventListener("resize", function () { fit.fit(); });
})();
