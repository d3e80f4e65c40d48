# alternate.sh FILTER ROUNDS REPS: runs the benchmark's cases matching FILTER (a regex of case
# names) with the library in $BASE and in $NEW, alternately, ROUNDS times, REPS repetitions
# each, and prints per round and case the fastest and median repetition (us) and the fastest
# ceiling. Run from the build directory's parent; BASE and NEW: folders holding a
# libembrope.so.1. The runs here had OMP_NUM_THREADS=1 in the environment.
for i in $(seq 1 "$2"); do for v in base new; do
  dir=$BASE; [ "$v" = new ] && dir=$NEW
  LD_LIBRARY_PATH="$dir" ./build/benchmarks/embrope-bench --full \
    --benchmark_filter="^($1)/manual_time\$" --benchmark_repetitions="$3" \
    --benchmark_format=json --benchmark_out="$dir/m$i.json" >/dev/null 2>&1
  python3 - "$dir/m$i.json" "$v" <<'PY'
import json, sys, statistics as st, collections
d = collections.defaultdict(list); pc = collections.defaultdict(list)
for b in json.load(open(sys.argv[1]))['benchmarks']:
    if b.get('run_type') != 'iteration': continue
    n = b['run_name'].replace('/manual_time', ''); d[n].append(b['real_time'])
    pc[n].append(b.get('ceiling_seconds', 0) * 1e6)
for n in d:
    print(sys.argv[2], f"{n:40s} min {min(d[n]):8.1f} med {st.median(d[n]):8.1f}  ceil min {min(pc[n]):8.1f}")
PY
done; done
