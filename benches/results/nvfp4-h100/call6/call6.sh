#!/usr/bin/env bash
# NVFP4 call 6 (final tree, as call 5): the CUDA kernel tests that call 5's 260 s did not reach
# (call 5 passed the other 28 and the module suite).
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1)
timeout 560 $tk --test-threads=8 --exact --skip cuda::bad_shapes_are_errors --skip cuda::delayed_casts_record_into_history --skip cuda::delayed_update_matches_tensor_ops --skip cuda::dropped_group_layout_leaves_reads_working --skip cuda::delayed_scaling_matches_reference --skip cuda::fp8_special_values_match_reference --skip cuda::fused::adamw_step_kernel_matches_its_burn_op_twin --skip cuda::fused::batched_matmul_matches_host_product_with_gradients --skip cuda::dequantize_matches_reference --skip cuda::fused::fused_adamw_trains_as_burn_adamw_with_norm_clipping --skip cuda::fused::fused_causal_attention_matches_burn_attention_with_gradients --skip cuda::fused::fused_rms_norm_and_swiglu_match_burn_ops_with_gradients --skip cuda::fused::fused_self_attention_equals_split_rope_attention_merge --skip cuda::fused::fused_rope_matches_burn_rotary_encoding_with_gradients --skip cuda::gather_rows_matches_reference --skip cuda::fused::one_hot_embedding_matches_burn_embedding_with_gradients --skip cuda::gemm_block_scales_match_host_rewrite --skip cuda::group_epilogue_matches_reference --skip cuda::group_layout_matches_reference --skip cuda::fused::head_split_and_merge_match_their_burn_op_twins --skip cuda::golden_inputs_match_reference --skip cuda::grouped_dbias_amax_matches_reference --skip cuda::grouped_shared_scale_matches_per_slice --skip cuda::linear_dbias_and_its_fused_amax_match_the_host_and_the_unfused_quantize --skip cuda::norm_and_activation_bad_shapes_are_errors --skip cuda::grouped_stats_equal_each_experts_own_statistics --skip cuda::activation_fused_into_the_fp8_cast_equals_activation_then_quantize --skip cuda::norm_backward_matches_f64  > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -10
grep -c "\.\.\. ok" $OUT/test-kernels.log
