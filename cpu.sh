# cpu.sh LABEL CMD... : runs CMD 5 times, prints wall and machine CPU-s (from /proc/stat) per run
label=$1; shift
hz=$(getconf CLK_TCK)
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
b0=$(busy); t0=$(date +%s.%N)
for i in 1 2 3 4 5; do "$@" || echo FAIL; done
b1=$(busy); t1=$(date +%s.%N)
echo "$label: wall $(echo "($t1-$t0)/5" | bc -l | cut -c1-6) s, cpu $(echo "($b1-$b0)/$hz/5" | bc -l | cut -c1-6) s per run"
