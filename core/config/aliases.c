/*
 * core/config/aliases.c - keys spelled the way other training stacks spell
 * them (DeepSpeed's JSON config, torchrun, PyTorch FSDP and optimizers,
 * the Hugging Face Trainer, nanoGPT), pointed at dtrain's: the hint an
 * unknown key, table or top-level key gets instead of a did-you-mean; and
 * the core's own key written under the wrong table.
 *
 * Only text for messages: nothing here changes how a config resolves, and
 * the few hints that name a shipped plugin's table ([zero]) are words for
 * the user, not a branch on a plugin's name.
 */
#include <stdio.h>
#include <string.h>

#include "config/config.h"

/* `path` is where the foreign stack writes the key: "a.b.c" matches a key
 * c found under a.b (a TOML table [a.b], or --set a.b=..., or a.b.c = ...),
 * a bare name matches that key under any table or at the top level. */
static const struct {
    const char *path, *who, *dtrain;
} aliases[] = {
    /* DeepSpeed */
    {"train_batch_size", "DeepSpeed", "train.global_batch"},
    {"train_micro_batch_size_per_gpu", "DeepSpeed", "train.micro_batch"},
    {"gradient_accumulation_steps", "DeepSpeed", "train.grad_accum"},
    {"steps_per_print", "DeepSpeed", "run.log_every"},
    {"communication_data_type", "DeepSpeed",
     "reduce_dtype in the data-parallel strategy's table ([ddp] reduce_dtype)"},
    {"zero_optimization.stage", "DeepSpeed", "[zero] stage (with parallel.data = \"zero\")"},
    {"zero_optimization.stage3_prefetch_bucket_size", "DeepSpeed", "[zero] prefetch_bucket_size"},
    {"zero_optimization.stage3_param_persistence_threshold", "DeepSpeed",
     "[zero] param_persistence_threshold"},
    {"offload_optimizer", "DeepSpeed",
     "parallel.offload = \"offload_cpu\" (device \"nvme\": \"offload_nvme\" and its [offload_nvme] "
     "path) with offload_what = \"optimizer\" in the strategy's table ([zero] offload_what)"},
    {"offload_param", "DeepSpeed",
     "parallel.offload = \"offload_cpu\" or \"offload_nvme\" with offload_what = \"params\" or "
     "\"optimizer_and_params\" in the strategy's table ([zero] offload_what, zero stage 3)"},
    {"nvme_path", "DeepSpeed", "[offload_nvme] path (with parallel.offload = \"offload_nvme\")"},
    {"zero_optimization", "DeepSpeed",
     "the [zero] table (with parallel.data = \"zero\"; its keys: dtrain plugins --describe zero)"},
    {"fp16.enabled", "DeepSpeed", "model.dtype = \"fp16\""},
    {"bf16.enabled", "DeepSpeed", "model.dtype = \"bf16\""},
    {"optimizer.params.lr", "DeepSpeed", "train.lr"},
    {"optimizer.params.betas", "DeepSpeed", "optimizer.beta1 and optimizer.beta2"},
    {"optimizer.params.eps", "DeepSpeed", "optimizer.eps"},
    {"optimizer.params.weight_decay", "DeepSpeed", "optimizer.weight_decay"},
    {"optimizer.params.momentum", "DeepSpeed", "optimizer.momentum"},
    {"scheduler.params.warmup_num_steps", "DeepSpeed", "train.warmup_steps"},
    {"scheduler.params.warmup_max_lr", "DeepSpeed", "train.lr"},
    {"scheduler.params.total_num_steps", "DeepSpeed", "train.steps"},
    /* torchrun */
    {"nproc_per_node", "torchrun", "launch.nproc"},
    {"nproc-per-node", "torchrun", "launch.nproc"},
    {"rdzv_endpoint", "torchrun", "launch.master_addr and launch.master_port"},
    /* PyTorch: optimizers, clip_grad_norm_, FSDP */
    {"betas", "PyTorch", "optimizer.beta1 and optimizer.beta2"},
    {"max_norm", "PyTorch", "train.gradient_clipping"},
    {"param_dtype", "PyTorch FSDP", "model.dtype"},
    {"auto_wrap_policy", "PyTorch FSDP", "[fsdp] min_num_params"},
    {"cpu_offload", "PyTorch FSDP",
     "parallel.offload = \"offload_cpu\" with [fsdp] offload_what = \"optimizer_and_params\" "
     "(CPUOffload(offload_params=True): parameters on the host, the optimizer step there)"},
    {"mixed_precision", "PyTorch FSDP",
     "model.dtype (MixedPrecision's param_dtype: \"bf16\" or \"fp16\") and [fsdp] reduce_dtype "
     "(its reduce_dtype)"},
    /* the Hugging Face Trainer */
    {"learning_rate", "the Hugging Face Trainer", "train.lr"},
    {"per_device_train_batch_size", "the Hugging Face Trainer", "train.micro_batch"},
    {"max_steps", "the Hugging Face Trainer", "train.steps"},
    {"max_grad_norm", "the Hugging Face Trainer", "train.gradient_clipping"},
    {"lr_scheduler_type", "the Hugging Face Trainer", "train.decay"},
    {"warmup_ratio", "the Hugging Face Trainer",
     "train.warmup_steps, counted in steps (warmup_ratio x train.steps)"},
    {"logging_steps", "the Hugging Face Trainer", "run.log_every"},
    {"save_steps", "the Hugging Face Trainer", "checkpoint.every"},
    {"save_total_limit", "the Hugging Face Trainer", "checkpoint.keep"},
    {"output_dir", "the Hugging Face Trainer", "run.out_dir"},
    /* nanoGPT */
    {"block_size", "nanoGPT", "train.seq_len (and model.context)"},
    {"max_iters", "nanoGPT", "train.steps"},
    {"warmup_iters", "nanoGPT", "train.warmup_steps"},
    {"grad_clip", "nanoGPT", "train.gradient_clipping"},
    {"eval_interval", "nanoGPT", "train.eval_every"},
    {"eval_iters", "nanoGPT", "train.eval_steps"},
    {"log_interval", "nanoGPT", "run.log_every"},
};

/* Aliases (by the path above) whose dtrain value is computed from their
 * own: dtrain's key `is` = the foreign value x the value of key `times`. */
static const struct {
    const char *path, *times, *is;
} products[] = {
    {"warmup_ratio", "train.steps", "train.warmup_steps"},
};

/* Does `path` name key `key` under `parent`? */
static int alias_matches(const char *path, const char *parent, const char *key)
{
    const char *dot = strrchr(path, '.');
    if (!dot)
        return strcmp(path, key) == 0;
    size_t pl = (size_t)(dot - path);
    return strcmp(dot + 1, key) == 0 && parent && strlen(parent) == pl &&
           strncmp(path, parent, pl) == 0;
}

int dt_config_alias(const char *parent, const char *key, char *buf, size_t cap)
{
    if (!key)
        return 0;
    for (size_t i = 0; i < DT_ARRAY_LEN(aliases); i++)
        if (alias_matches(aliases[i].path, parent, key)) {
            snprintf(buf, cap, "%s is %s's name for %s", aliases[i].path, aliases[i].who,
                     aliases[i].dtrain);
            return 1;
        }
    return 0;
}

int dt_config_alias_product(const char *parent, const char *key, const char **times,
                            const char **is)
{
    if (!key)
        return 0;
    for (size_t i = 0; i < DT_ARRAY_LEN(products); i++)
        if (alias_matches(products[i].path, parent, key)) {
            *times = products[i].times;
            *is = products[i].is;
            return 1;
        }
    return 0;
}

int dt_config_home(const char *parent, const char *key, char *buf, size_t cap)
{
    if (!key)
        return 0;
    for (uint32_t s = 0; s < dt_core_n_sections; s++) {
        const dt_config_section_t *sec = &dt_core_sections[s];
        if (parent && strcmp(parent, sec->table) == 0)
            continue;
        for (uint32_t k = 0; k < sec->n_keys; k++)
            if (strcmp(sec->keys[k].name, key) == 0) {
                snprintf(buf, cap, "'%s' is a key of [%s] (%s.%s)", key, sec->table,
                         sec->table, key);
                return 1;
            }
    }
    return 0;
}
