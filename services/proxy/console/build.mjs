// Bundles the console (xterm.js and src/console.js) into the proxy's package:
// services/proxy/src/einsora/proxy/static/console/{console.js,console.css}. That output is
// not in git; `make console` (and `make setup`, where Node is present) runs this.
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";

const out = "../src/einsora/proxy/static/console";
mkdirSync(out, { recursive: true });
await build({
  entryPoints: ["src/console.js"],
  bundle: true,
  minify: true,
  format: "iife",
  target: "es2020",
  outfile: `${out}/console.js`,
  legalComments: "linked",
});
copyFileSync("node_modules/@xterm/xterm/css/xterm.css", `${out}/console.css`);
