#!/usr/bin/env bash
# Call 6: the final tree's wall-clock host profile (device threads that have not run are skipped)
# of the 235M step, current scaling and bf16.
source "$(dirname "$0")/common.sh"
for r in current_scaling bf16; do
  moe moe-235m $r 80 prof-$r --host-profile /tmp/prof-$r
  cp /tmp/prof-$r/*/summary.txt $OUT/host-profile-$r.txt 2>/dev/null
  head -1 $OUT/host-profile-$r.txt; grep "^## thread" $OUT/host-profile-$r.txt
  grep -E "Server::start$|ComputeServer>::launch$|DynamicPool as .*try_reserve$|run_on_cubecl_stream$|submit_inner$" $OUT/host-profile-$r.txt | head -8
done
