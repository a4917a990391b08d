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
p=s.get('host_phase_ms_per_step',{})
print('$2', 'loss',round(s['final_loss'],4),'eval',round(s.get('eval_loss',0) or 0,4),'ms/step',round(s['step_ms'],1),'host',round(s.get('host_ms_per_step',0),1),'fwd',round(p.get('forward',0),1),'bwd',round(p.get('backward',0),1),'opt',round(p.get('optimizer',0),1),'wait',s.get('sync_wait_ms_per_step'))
"; }
moe() { # moe BIN CONFIG RECIPE STEPS TAG [extra args]
  local bin=$1 cfg=$2 r=$3 steps=$4 tag=$5; shift 5
  local t0=$(date +%s)
  timeout 150 bin/$bin --config ../configs/$cfg.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps $steps --quiet --no-checkpoint --out /tmp/runs/$tag "$@" > /tmp/runs-$tag.log 2>&1 || { echo "$tag FAILED"; tail -3 /tmp/runs-$tag.log | cut -c1-300; }
  summary /tmp/runs/$tag "$tag ($(( $(date +%s) - t0 )) s)"
  cp /tmp/runs/$tag/*/summary.json $OUT/moe-$tag.json 2>/dev/null
}
