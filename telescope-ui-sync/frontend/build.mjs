// Bundles src/main.ts (TypeScript, uPlot, markdown-it, KaTeX) with esbuild into
// ../src/telescope_ui_sync/static/: index.html, assets/app.js, assets/app.css and KaTeX's fonts.
// Everything the page loads comes from there: nothing is fetched from the network at run time.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "src", "telescope_ui_sync", "static");
rmSync(join(out, "assets"), { recursive: true, force: true });
mkdirSync(join(out, "assets"), { recursive: true });

await build({
  entryPoints: { app: join(here, "src", "main.ts") },
  bundle: true,
  minify: true,
  sourcemap: false,
  format: "esm",
  target: ["chrome110", "firefox110", "safari16"],
  outdir: join(out, "assets"),
  assetNames: "[name]-[hash]",
  loader: { ".woff2": "file", ".woff": "file", ".ttf": "file" },
  legalComments: "linked",
  logLevel: "info",
});
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
