#!/usr/bin/env bash
# `mixers check --backend cuda` over a grid of sequence lengths, head dims and precision modes,
# one line per run (its pass/fail count, and the first failing rows when any fail). For the GPU
# machine, with the release binary carried there.
#
#   bench/gpu/check_matrix.sh BIN MIXER [T,...] [HEAD_DIM,...] [MODE,...]
#
# MODE is exact, tf32 or bf16 (bf16 runs `--dtype bf16`). Defaults: T = 1,63,64,65,1000,4099 (the
# issue's lengths), head dims 16,40,64,70, modes exact,tf32,bf16. Exit status 1 when any run
# failed. Compiled kernels are kept between the runs (MIXERS_KERNEL_CACHE), so only the first
# run of each shape pays NVRTC.
set -u
bin=${1:?usage: check_matrix.sh BIN MIXER [T,...] [HEAD_DIM,...] [MODE,...]}
mixer=${2:?usage: check_matrix.sh BIN MIXER [T,...] [HEAD_DIM,...] [MODE,...]}
IFS=, read -r -a seqs <<<"${3:-1,63,64,65,1000,4099}"
IFS=, read -r -a dims <<<"${4:-16,40,64,70}"
IFS=, read -r -a modes <<<"${5:-exact,tf32,bf16}"
status=0
for hd in "${dims[@]}"; do
  for t in "${seqs[@]}"; do
    for m in "${modes[@]}"; do
      if [ "$m" = bf16 ]; then p=(--dtype bf16); else p=(--precision "$m"); fi
      out=$("$bin" check --backend cuda --mixer "$mixer" --seq "$t" --head-dim "$hd" "${p[@]}" 2>&1)
      rc=$?
      echo "$mixer T=$t hd=$hd $m: $(echo "$out" | grep -E 'checks,' | tail -1) (exit $rc)"
      if [ $rc -ne 0 ]; then
        status=1
        echo "$out" | grep -E 'FAIL|error' | head -3
      fi
    done
  done
done
exit $status
