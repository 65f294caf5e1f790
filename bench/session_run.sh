#!/usr/bin/env bash
# this session's device run (deleted before committing)
make -j16 build/libflashattn_test.so build/libflashattn_nothreads_test.so build/libflashattn_tiles_test.so > $OUT/make.txt 2>&1
python3 bench/ab_gpu.py "256,1024,0;256,2048,0;256,4096,0;256,16384,0;256,1024,1" main=build/variant_f256_main.so always=build/variant_f256_resc_always.so late=build/variant_f256_resc_late.so main_again=build/variant_f256_main.so > $OUT/ab_f256_resc.txt 2>&1
cat $OUT/ab_f256_resc.txt
