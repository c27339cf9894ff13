/*
 * core/config/schema.c - the core's own config sections: every key the
 * core reads, its type, default, allowed range and a one-line doc.
 *
 * Plugins declare their tables the same way (dtrain/plugin.h); the staged
 * resolve (core/setup) applies these sections and each selected plugin's
 * keys with dt_config_apply_schema.  settings.c reads these keys into typed
 * structs and the model reads [model]: a rename here is a rename there.
 */
#include <string.h>

#include "config/config.h"

/* min = max = 0 means "no range" (dtrain/plugin.h). */
#define NO_RANGE 0, 0
#define K_STR(n, d, doc) {n, DT_CFG_STRING, d, NO_RANGE, NULL, doc}
#define K_INT(n, d, lo, hi, doc) {n, DT_CFG_INT, d, lo, hi, NULL, doc}
#define K_FLT(n, d, lo, hi, doc) {n, DT_CFG_FLOAT, d, lo, hi, NULL, doc}
#define K_BOOL(n, d, doc) {n, DT_CFG_BOOL, d, NO_RANGE, NULL, doc}
#define K_ENUM(n, d, ch, doc) {n, DT_CFG_ENUM, d, NO_RANGE, ch, doc}

static const dt_config_key_t run_keys[] = {
    K_STR("name", "\"dtrain\"", "run name; outputs go to <out_dir>/<name>"),
    K_INT("seed", "1337", 0, 2147483647.0, "random seed for init and data order"),
    K_STR("out_dir", "\"runs\"", "folder for run outputs"),
    K_STR("plugin_path", "\"\"", "':'-separated plugin folders searched first"),
    K_STR("device", "\"cpu\"", "device plugin (compute backend)"),
    K_STR("comm", "\"shm\"", "comm plugin (communicator)"),
    K_INT("log_every", "1", 1, 1e9, "print a log line every N steps"),
    K_STR("metrics", "\"\"", "JSON-lines metrics file; empty = none"),
};

static const dt_config_key_t model_keys[] = {
    K_STR("arch", "\"gpt2\"",
          "model plugin (architecture): gpt2, llama (the LLaMA family: RMSNorm, rotary "
          "embeddings, grouped-query attention, SwiGLU), mlp (a bigram Linear+GELU stack, for "
          "testing), or another model plugin on the search path"),
    K_STR("preset", "\"custom\"",
          "gpt2, llama: named size (the model plugin's preset slot; gpt2: gpt2-tiny, "
          "gpt2-small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m; llama: llama-tiny, "
          "smollm-135m, smollm-360m, tinyllama-1.1b, llama-3.2-1b, llama-3.2-3b, llama-2-7b); "
          "custom = use n_layer/n_head/n_embd"),
    K_INT("n_layer", "2", 1, 1024, "gpt2, llama: transformer blocks"),
    K_INT("n_head", "4", 1, 1024, "gpt2, llama: attention (query) heads"),
    K_INT("n_embd", "128", 1, 65536, "gpt2, llama: embedding width (hidden_size)"),
    K_INT("vocab_size", "256", 2, 16777216.0, "vocabulary size (token ids and output classes)"),
    K_INT("context", "64", 1, 1048576.0,
          "gpt2, llama: maximum sequence length (llama: max_position_embeddings)"),
    K_ENUM("dtype", "\"fp32\"", "fp32|bf16|fp16",
           "compute dtype of parameters (bf16, fp16: matmuls read 16-bit weights; "
           "gradients and the optimizer's master copy stay fp32, activations as "
           "[model] activations says; fp16 scales the loss as [fp16] says)"),
    K_ENUM("activations", "\"fp32\"", "fp32|bf16",
           "dtype of activations and their gradients: bf16 halves their memory and runs "
           "matmuls and attention on bf16 tensor cores, with f32 accumulation and f32 "
           "parameter gradients (the cuda device; the cpu device stores bf16 and "
           "computes in f32, the same rounding, so CI takes bf16 runs' paths)"),
    K_ENUM("activation_checkpointing", "\"none\"", "none|all|every",
           "recompute activations in backward"),
    K_INT("checkpoint_every", "2", 1, 1024,
          "with activation_checkpointing = \"every\": recompute every k-th unit"),
    K_INT("mlp_in", "16", 1, 1048576.0, "mlp: embedding width of each input token"),
    K_INT("mlp_hidden", "64", 1, 1048576.0, "mlp: hidden width"),
    K_INT("mlp_layers", "2", 0, 1024, "mlp: hidden Linear+GELU layers (units)"),
    K_INT("n_kv_head", "0", 0, 1024,
          "llama: key/value heads (num_key_value_heads; divides n_head); 0 = n_head"),
    K_INT("head_dim", "0", 0, 65536, "llama: size of one head; 0 = n_embd / n_head"),
    K_INT("intermediate_size", "0", 0, 1048576.0,
          "llama: SwiGLU MLP width (gate_proj/up_proj rows); 0 = 4 n_embd"),
    K_FLT("rope_theta", "10000.0", 1, 1e12, "llama: rotary embedding base"),
    K_FLT("rms_norm_eps", "1e-5", 0, 1, "llama: RMSNorm epsilon"),
    K_BOOL("tie_embeddings", "false",
           "llama: the LM head is embed_tokens (tie_word_embeddings); false = its own lm_head"),
    K_BOOL("qkv_bias", "false", "llama: biases on q_proj, k_proj, v_proj (Qwen2)"),
    K_ENUM("rope_scaling", "\"none\"", "none|llama3",
           "llama: rotary frequency scaling: none, or llama3 (Llama 3.1's, with the "
           "rope_scaling_* keys)"),
    K_FLT("rope_scaling_factor", "8.0", 1, 1e6, "llama, rope_scaling = llama3: factor"),
    K_FLT("rope_scaling_low_freq_factor", "1.0", 0, 1e6,
          "llama, rope_scaling = llama3: low_freq_factor"),
    K_FLT("rope_scaling_high_freq_factor", "4.0", 0, 1e6,
          "llama, rope_scaling = llama3: high_freq_factor"),
    K_INT("rope_scaling_original_max_position_embeddings", "8192", 1, 1e9,
          "llama, rope_scaling = llama3: original_max_position_embeddings"),
};

static const dt_config_key_t data_keys[] = {
    K_STR("train", "\"\"", "training token file (llm.c format)"),
    K_STR("val", "\"\"", "validation token file (llm.c format); empty = none"),
    K_BOOL("shuffle", "true", "shuffle batch order each epoch"),
};

static const dt_config_key_t train_keys[] = {
    K_INT("steps", "100", 1, 1e9, "optimizer steps"),
    K_INT("micro_batch", "4", 1, 1048576.0, "sequences per rank per micro-step"),
    K_INT("grad_accum", "0", 0, 1048576.0, "micro-steps per step; 0 = derive"),
    K_INT("global_batch", "0", 0, 1073741824.0,
          "sequences per step over all ranks; 0 = derive"),
    K_INT("seq_len", "64", 1, 1048576.0, "tokens per sequence"),
    K_FLT("lr", "6e-4", 0, 10, "peak learning rate"),
    K_FLT("min_lr", "0.0", 0, 10, "learning rate at the end of decay"),
    K_INT("warmup_steps", "0", 0, 1e9, "linear warmup steps"),
    K_ENUM("decay", "\"cosine\"", "cosine|linear|constant", "lr decay after warmup"),
    K_FLT("gradient_clipping", "1.0", 0, 1e9, "global-norm clip; 0 = off"),
    K_INT("eval_every", "0", 0, 1e9, "validate every N steps; 0 = never"),
    K_INT("eval_steps", "4", 1, 1e6, "global batches per validation, at any world size"),
    K_INT("stop_at", "0", 0, 1e9,
          "stop after this step and checkpoint (0 = run all steps); the schedule still spans `steps`"),
};

static const dt_config_key_t optimizer_keys[] = {
    K_ENUM("type", "\"adamw\"", "adamw|sgd", "optimizer"),
    K_FLT("beta1", "0.9", 0, 0.999999999, "adamw: first-moment decay"),
    K_FLT("beta2", "0.95", 0, 0.999999999, "adamw: second-moment decay"),
    K_FLT("eps", "1e-8", 0, 1, "adamw: denominator epsilon"),
    K_FLT("weight_decay", "0.1", 0, 10, "decoupled weight decay"),
    K_FLT("momentum", "0.9", 0, 1, "sgd: momentum"),
    K_BOOL("nesterov", "false", "sgd: Nesterov momentum"),
};

static const dt_config_key_t parallel_keys[] = {
    K_STR("data", "\"ddp\"", "data-parallel strategy plugin"),
    K_INT("tensor", "1", 1, 4096, "tensor-parallel degree"),
    K_INT("pipeline", "1", 1, 4096, "pipeline stages"),
    K_STR("offload", "\"none\"", "offload plugin, or \"none\""),
};

/* The pipeline's layout, the same keys whichever schedule plugin runs it
 * (dtrain/schedule.h hands them to the plugin). */
static const dt_config_key_t pipeline_keys[] = {
    K_STR("schedule", "\"1f1b\"",
          "pipeline schedule plugin (parallel.pipeline > 1): gpipe (all forwards, then all "
          "backwards; stashes every micro-batch's input) or 1f1b (one forward one backward; "
          "stashes at most the stage count), or another schedule on the search path"),
    K_BOOL("keep_activations", "true",
           "keep the activations of every micro-batch in flight (1f1b: at most the stage "
           "count, gpipe: all of them) so each backward runs on its forward's; false keeps one "
           "micro-batch's and recomputes the others' forwards (less memory, about 1/3 more "
           "compute on every stage but the last)"),
    K_INT("virtual_stages", "1", 1, 16,
          "chunks per stage (Megatron's interleaved schedule): the model is cut into "
          "pipeline x virtual_stages pieces, stage k running pieces k, k + pipeline, ...; the "
          "bubble shrinks by this factor for as many more boundary transfers; needs "
          "grad_accum a multiple of the stages and keep_activations"),
    K_ENUM("balance", "\"uniform\"", "uniform|params|flops",
           "units per stage: uniform (equal counts), params (contiguous stages with the "
           "smallest largest parameter count) or flops (the same by FLOPs per token: GPT-2's "
           "embedding runs no matmul, its head runs the LM head)"),
};

/* Tensor parallelism's scheme: the plugin (dtrain/tensor_parallel.h) whose
 * collectives surround the model's split layers. */
static const dt_config_key_t tensor_keys[] = {
    K_STR("scheme", "\"megatron\"",
          "tensor-parallel scheme plugin (parallel.tensor > 1): megatron (Megatron-LM's 1D "
          "layout: heads, MLP and vocabulary split, partial results all-reduced), "
          "megatron_sp (the same with Megatron-LM's sequence parallelism: norms and residual "
          "adds on 1/tensor of a micro-batch's positions, all-gathers and reduce-scatters "
          "instead of all-reduces; seq_len a multiple of tensor), or another scheme on the "
          "search path"),
};

static const dt_config_key_t launch_keys[] = {
    K_INT("nproc", "1", 1, 256, "local ranks to spawn (on each node)"),
    K_INT("nnodes", "1", 1, 65536,
          "nodes of the job: each runs `dtrain run` once with its node_rank and starts nproc "
          "ranks (global rank = node_rank x nproc + local rank)"),
    K_INT("node_rank", "0", 0, 65535,
          "this node's index in [0, nnodes); node 0 hosts the rendezvous (the one key that "
          "differs between nodes)"),
    K_FLT("timeout", "300.0", 0.001, 1e6, "seconds any collective may wait"),
    K_STR("master_addr", "\"127.0.0.1\"",
          "rendezvous address: node 0's host name or IP, reachable from every node"),
    K_INT("master_port", "29500", 0, 65535, "rendezvous port (node 0 listens on it)"),
    K_INT("min_nnodes", "0", 0, 65536,
          "elastic: > 0 makes the job elastic (`--nnodes MIN:MAX` sets this to MIN and nnodes "
          "to MAX): when a rank or node fails, the launchers left re-form the job with at "
          "least this many nodes and at most nnodes and resume from the last checkpoint; "
          "node 0 then hosts the launchers' store on master_port, the ranks meet on "
          "master_port + 1; 0 = not elastic"),
    K_INT("max_restarts", "3", 0, 1000000,
          "elastic: restarts after failures before the job gives up (exit 1)"),
};

static const dt_config_key_t checkpoint_keys[] = {
    K_STR("dir", "\"\"", "checkpoint folder; empty = <out_dir>/<name>/ckpt"),
    K_INT("every", "0", 0, 1e9, "save every N steps; 0 = no periodic saves"),
    K_INT("keep", "2", 1, 1e6, "checkpoints kept"),
    K_STR("resume", "\"\"", "\"\" = fresh start, \"latest\", or a checkpoint path"),
    K_BOOL("overwrite", "false",
           "a fresh start (resume = \"\") into a folder holding checkpoints removes them "
           "first; false = refused"),
    K_BOOL("async", "false",
           "periodic saves (every) written in the background: each rank copies its shard to "
           "memory at the step; a thread checksums, writes and fsyncs it (rank 0's then "
           "writes the manifest and commits) while the next steps train; the save "
           "commits at a later step boundary, at the latest before the next save, so a restart "
           "(an elastic one: --nnodes MIN:MAX) loses fewer than 2 x every steps (every + 2 "
           "when the writes keep up); costs a copy of the rank's state in host memory; the last "
           "step's save is written at once"),
};

/* Loss scaling of model.dtype = "fp16", under DeepSpeed's names (its
 * "fp16" block) so a DeepSpeed config carries over key for key; a table of
 * its own rather than [train] keys because it is inert in every other
 * dtype (setting it there is an error: settings.c).  "enabled" has no
 * counterpart: model.dtype is the one switch. */
static const dt_config_key_t fp16_keys[] = {
    K_FLT("loss_scale", "0.0", 0, 0x1p127,
          "0 = dynamic loss scaling; > 0 = this static scale (an overflow then stops the run)"),
    K_INT("initial_scale_power", "16", 0, 127, "dynamic: the scale starts at 2^this"),
    K_INT("loss_scale_window", "1000", 1, 1e9,
          "dynamic: clean steps in a row before the scale doubles"),
    K_INT("hysteresis", "2", 1, 1e6,
          "dynamic: overflowing steps skipped before the scale first halves"),
    K_FLT("min_loss_scale", "1.0", 0x1p-126, 0x1p127,
          "dynamic: the scale never goes below this; an overflow at it stops the run "
          "naming the first non-finite tensor"),
};

#define SECTION(t, k, d) {t, k, (uint32_t)DT_ARRAY_LEN(k), d}

const dt_config_section_t dt_core_sections[] = {
    SECTION("run", run_keys, "the run: name, outputs, plugins"),
    SECTION("model", model_keys, "the model"),
    SECTION("data", data_keys, "training and validation data"),
    SECTION("train", train_keys, "the training loop and schedule"),
    SECTION("optimizer", optimizer_keys, "the optimizer"),
    SECTION("parallel", parallel_keys, "parallel strategies"),
    SECTION("pipeline", pipeline_keys, "the pipeline's schedule and layout"),
    SECTION("tensor", tensor_keys, "the tensor-parallel scheme"),
    SECTION("launch", launch_keys, "processes and rendezvous"),
    SECTION("checkpoint", checkpoint_keys, "saving and resuming"),
    SECTION("fp16", fp16_keys, "loss scaling of model.dtype = \"fp16\" (DeepSpeed's fp16 block)"),
};

const uint32_t dt_core_n_sections = (uint32_t)DT_ARRAY_LEN(dt_core_sections);

const char *dt_core_default_string(const char *table, const char *key, char *buf, size_t cap)
{
    for (uint32_t s = 0; s < dt_core_n_sections; s++) {
        const dt_config_section_t *sec = &dt_core_sections[s];
        if (strcmp(sec->table, table) != 0)
            continue;
        for (uint32_t k = 0; k < sec->n_keys; k++) {
            const char *def = sec->keys[k].def;
            size_t n = def ? strlen(def) : 0;
            if (strcmp(sec->keys[k].name, key) != 0 || n < 2 || def[0] != '"' ||
                def[n - 1] != '"' || n - 2 >= cap)
                continue;
            memcpy(buf, def + 1, n - 2); /* declared defaults hold no escapes */
            buf[n - 2] = '\0';
            return buf;
        }
    }
    return NULL;
}
