# Shared by the calls: unpack once per machine, corpus, summary printer.
cd "$(dirname "$0")"
if [ ! -x bin/moe_train ]; then
  rm -rf bin data && tar -xJf bundle.tar.xz && xz -dc moe_train.xz > bin/moe_train && xz -dc moe_train_old.xz > bin/moe_train_old && chmod +x bin/moe_train bin/moe_train_old
fi
[ -s /tmp/corpus.txt ] || find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
summary() { python3 -c "
import json,glob,sys
s=json.load(open(glob.glob('$1/*/summary.json')[0]))
c=s.get('debug_step_cost') or {}
o=c.get('overhead')
print('$2', 'loss',round(s['final_loss'],6),'ms/step',round(s['step_ms'],1),'host',round(s.get('host_ms_per_step',0),1),
  'sampled',round(c.get('sampled_host_ms',0),1),'after',round(c.get('after_sampled_host_ms',0),1),'clean',round(c.get('clean_host_ms',0),1),
  'overhead', (str(round(100*o,1))+' %') if o is not None else '-', 'metric reads/step', round(s.get('debug_metric_reads_per_step',0),2), 'waited', round(s.get('blocking_debug_metric_reads_per_step',0),2))
"; }
moe() { # moe BIN CONFIG RECIPE STEPS TAG [extra args]
  local bin=$1 cfg=$2 r=$3 steps=$4 tag=$5; shift 5
  local t0=$(date +%s)
  timeout 170 bin/$bin --config ../configs/$cfg.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps $steps --quiet --no-checkpoint --out /tmp/runs/$tag "$@" > /tmp/runs-$tag.log 2>&1 || { echo "$tag FAILED"; tail -3 /tmp/runs-$tag.log | cut -c1-300; }
  summary /tmp/runs/$tag "$tag ($(( $(date +%s) - t0 )) s)"
  python3 -c "import json,sys,glob; print(json.dumps({'tag': '$tag', **json.load(open(glob.glob('/tmp/runs/$tag/*/summary.json')[0]))}))" >> $OUT/moe-summaries.jsonl 2>/dev/null
  grep -h "^|" /tmp/runs-$tag.log | head -${ROWS:-3}
}
