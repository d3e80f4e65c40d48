import json,sys
d=json.load(open(sys.argv[1]))
for b in d["benchmarks"]:
    if b.get("aggregate_name")!="median": continue
    t=b["real_time"]; c=b["ceiling_seconds"]*1e6
    print(f'{b["run_name"][:60]:60s} op {t:9.1f} us  ceiling {c:9.1f} us  {100*c/t:5.0f}%  {b["bytes"]/c/1e3:.1f} GB/s ceiling')
