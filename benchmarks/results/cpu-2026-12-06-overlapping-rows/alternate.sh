# alternate.sh ROUNDS "ENV=VALUE" rope_calls-arguments...: runs rope_calls (the driver in
# ../cpu-2026-12-06-f16-store-nan-branch/rope_calls.cpp) on one thread with the library in
# $BASE and in $NEW, alternately, ROUNDS times; prints each run's fastest call and the ratio of
# the fastest over all runs (base / new). BASE and NEW: folders holding a libembrope.so.1.
R=$1; E=$2; shift 2
for r in $(seq 1 "$R"); do for v in base new; do
  dir=$BASE; [ "$v" = new ] && dir=$NEW
  printf "%s " "$v"; env "$E" OMP_NUM_THREADS=1 LD_LIBRARY_PATH="$dir" ./rope_calls "$@" | awk '{print $2}'
done; done | awk '{m[$1]=(m[$1]==""||$2<m[$1])?$2:m[$1]; a[$1]=a[$1]" "$2} END{print "base", m["base"], "|" a["base"]; print "new ", m["new"], "|" a["new"]; printf "ratio %.3f\n", m["base"]/m["new"]}'
