// The serial console page of a VM: a terminal whose bytes go over a WebSocket to the access
// proxy, which relays them to the VM's serial port. The page and the socket are on the
// workload's own site, so the site's session cookie is what lets it in.
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";

const status = document.getElementById("status");
const term = new Terminal({ convertEol: false, cursorBlink: true, scrollback: 5000 });
const fit = new FitAddon();
term.loadAddon(fit);
term.open(document.getElementById("terminal"));
fit.fit();
window.addEventListener("resize", () => fit.fit());

const scheme = location.protocol === "https:" ? "wss:" : "ws:";
const socket = new WebSocket(`${scheme}//${location.host}/_einsora/console/ws`);
socket.binaryType = "arraybuffer";
const encoder = new TextEncoder();
socket.onopen = () => {
  status.textContent = "connected";
  term.focus();
};
socket.onmessage = (event) => {
  term.write(typeof event.data === "string" ? event.data : new Uint8Array(event.data));
};
socket.onclose = () => {
  status.textContent = "disconnected (the VM stopped, or the session ended): reload to reconnect";
};
term.onData((data) => {
  if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
});
window.einsoraConsole = { term, socket };
