#!/usr/bin/env bash
# Rebuilds the dashboard's third-party browser assets from web/package-lock.json and copies the
# minified files into the Python package, so `pip install` needs no node and nothing is fetched
# from a CDN at run time. Run it after changing web/package.json; commit what it copies.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/src/gpuscope/web/dashboard/static/vendor"
cd "$root/web"
npm ci --no-audit --no-fund --ignore-scripts
mkdir -p "$dest"
cp node_modules/uplot/dist/uPlot.iife.min.js "$dest/uPlot.iife.min.js"
cp node_modules/uplot/dist/uPlot.min.css "$dest/uPlot.min.css"
cp node_modules/uplot/LICENSE "$dest/uPlot.LICENSE"
echo "build-assets: uPlot $(node -p "require('./node_modules/uplot/package.json').version") -> $dest"
