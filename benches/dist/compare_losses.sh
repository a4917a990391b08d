# The loss comparison of the multi-GPU checks (sourced by run_2gpu.sh and run_ep.sh, which define
# `pass` and `fail`, and set BIN to the moe_train binary).
#
# losses METRICS: the "loss" of every line of a metrics.jsonl, one a line.
# compare_losses REFERENCE OTHER: "ok ..." or "bad ...": 20 steps, step 0 within 0.5 % and every
# step within 2 % of the reference run's (why: run_2gpu.sh's header).
# reference_run LABEL DIR RECIPE: the one-GPU run of benches/dist/dp-check.json under RECIPE into
# DIR; on failure a FAIL line for LABEL and status 1.
# check_run LABEL REFERENCE DIR RECIPE ARGS...: the multi-rank run `BIN ARGS... --out DIR` (the
# recipe RECIPE among ARGS), then its losses against REFERENCE's (a metrics.jsonl): one PASS or
# FAIL line for LABEL.
losses() { grep -o '"loss":[-0-9.eE+naNinf]*' "$1" | cut -d: -f2; }
compare_losses() {
  paste <(losses "$1") <(losses "$2") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
      if (n == 1) first = r; if (r > worst) { worst = r; at = n - 1 } }
    END { ok = (n == 20 && first <= 0.005 && worst <= 0.02);
          printf "%s %d steps, step 0 differs by %.4f %%, worst %.4f %% at step %d\n", ok ? "ok" : "bad", n, 100 * first, 100 * worst, at }'
}
reference_run() {
  local label=$1 dir=$2 recipe=$3
  CUDA_VISIBLE_DEVICES=0 timeout 240 "$BIN" --config benches/dist/dp-check.json --recipe "recipes/$recipe.json" \
    --no-checkpoint --quiet --out "$dir" >"$dir.log" 2>&1 \
    || { fail "$label: the one-GPU run failed (see $dir.log)"; tail -5 "$dir.log"; return 1; }
}
check_run() {
  local label=$1 reference=$2 dir=$3 recipe=$4 verdict
  shift 4
  [ -s "$reference" ] || { fail "$label: no one-GPU run to compare with"; return; }
  timeout 300 "$BIN" "$@" --out "$dir" >"$dir.log" 2>&1 \
    || { fail "$label: the run failed (see $dir.log)"; tail -5 "$dir.log"; return; }
  verdict=$(compare_losses "$reference" "$dir/$recipe/metrics.jsonl")
  case "$verdict" in
    ok*) pass "$label: ${verdict#ok }" ;;
    *) fail "$label: ${verdict#bad } (tolerance: step 0 0.5 %, every step 2 %, 20 steps)" ;;
  esac
}
