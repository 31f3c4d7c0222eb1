/// <reference types="vitest/config" />
// The dashboard's build: Preact's JSX through esbuild (no Babel), one hashed bundle under
// assets/, no inline script or style (the api serves it under a CSP of 'self' only).
import { defineConfig } from "vite";

export default defineConfig({
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  resolve: {
    alias: { react: "preact/compat", "react-dom": "preact/compat" },
  },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    // No polyfill: it would be inline, and every browser we support has modulepreload.
    modulePreload: { polyfill: false },
    assetsInlineLimit: 0,
    sourcemap: false,
    reportCompressedSize: true,
  },
  server: {
    // `npm run dev` against a running api (Solo's default port).
    proxy: { "/v1": "http://127.0.0.1:8080", "/openapi.json": "http://127.0.0.1:8080" },
  },
  test: {
    environment: "happy-dom",
    include: ["src/**/*.test.{ts,tsx}"],
  },
});
