# Shared by the calls: unpack once per machine, corpus, summary printer, MoE runner.
cd "$(dirname "$0")"
if [ ! -x bin/moe_train ]; then
  rm -rf bin data && tar -xJf bundle.tar.xz && xz -dc moe_train.xz > bin/moe_train && chmod +x bin/moe_train
  [ -f moe_train_old.xz ] && xz -dc moe_train_old.xz > bin/moe_train_old && chmod +x bin/moe_train_old
fi
[ -s /tmp/corpus.txt ] || find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
summary() { python3 -c "
import json,glob
s=json.load(open(glob.glob('$1/*/summary.json')[0]))
print('$2', 'loss',round(s['final_loss'],6),'ms/step',round(s['step_ms'],2),'host',round(s.get('host_ms_per_step') or 0,1),
  'wait',round(s.get('sync_wait_ms_per_step') or 0,1),'exact/bound',round(s.get('exact_batches_per_step',0),1),round(s.get('bound_batches_per_step',0),1))
"; }
moe() { # moe CONFIG RECIPE STEPS TAG [extra args]; env passes through; BIN=moe_train_old for the old binary
  local cfg=$1 r=$2 steps=$3 tag=$4; shift 4
  local t0=$(date +%s)
  timeout 200 bin/${BIN:-moe_train} --config ../configs/$cfg.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps $steps --quiet --no-checkpoint --out /tmp/runs/$tag "$@" > /tmp/runs-$tag.log 2>&1 || { echo "$tag FAILED"; tail -3 /tmp/runs-$tag.log | cut -c1-300; }
  summary /tmp/runs/$tag "$tag ($(( $(date +%s) - t0 )) s)"
  python3 -c "import json,glob; print(json.dumps({'tag': '$tag', **json.load(open(glob.glob('/tmp/runs/$tag/*/summary.json')[0]))}))" >> $OUT/moe-summaries.jsonl 2>/dev/null
}
