# The loss comparison of the multi-GPU checks (sourced by run_2gpu.sh and run_ep.sh).
#
# losses METRICS: the "loss" of every line of a metrics.jsonl, one a line.
# compare_losses REFERENCE OTHER: "ok ..." or "bad ...": 20 steps, step 0 within 0.5 % and every
# step within 2 % of the reference run's (why: run_2gpu.sh's header).
losses() { grep -o '"loss":[-0-9.eE+naNinf]*' "$1" | cut -d: -f2; }
compare_losses() {
  paste <(losses "$1") <(losses "$2") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
      if (n == 1) first = r; if (r > worst) { worst = r; at = n - 1 } }
    END { ok = (n == 20 && first <= 0.005 && worst <= 0.02);
          printf "%s %d steps, step 0 differs by %.4f %%, worst %.4f %% at step %d\n", ok ? "ok" : "bad", n, 100 * first, 100 * worst, at }'
}
