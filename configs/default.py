"""CPU default: a small StableMoE LM on Penn Treebank, both stages; about 23 minutes of training on 2 idle cores.

The StableMoE variant of the tuned sweep (docs/tuning.md) with the lowest seed-0 validation perplexity among the
settings whose MoE layer is alive by the health verdict (it does measurable work: removing it costs >= 1% of
validation perplexity; docs/router_health.md): balance loss over all tokens and X-MoE's cosine routing, two named
deviations from the paper, at the learning rate and warmup chosen on validation (6e-3, 400 steps; the dense
backbone's choice too). Seed 0 chose it; the README reports seeds 1-3. What each setting measured: docs/tuning.md
and docs/results.md.

Run: python -m stablemoe_jax.main --config configs/default.py --workdir runs/default
Override any value: --config.train.steps=200 --config.model.moe.num_experts=4
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.corpus = "ptb"  # "ptb" | "text" (a user's own train/valid/test.txt)
  config.data.data_dir = ""  # "" -> $STABLEMOE_DATA_DIR
  config.data.tokenizer = "word"  # "word" | "sentencepiece"
  config.data.sentencepiece_vocab_size = 8000

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = 0  # 0 -> the tokenizer's; otherwise must be >= it
  config.model.d_model = 256
  config.model.num_heads = 4
  config.model.num_layers = 4
  config.model.d_ff = 1024
  config.model.max_len = 128
  config.model.dropout = 0.05
  config.model.dtype = "float32"  # compute dtype (float32 | bfloat16 | float16); parameters stay float32
  # jax.nn.dot_product_attention implementation: auto (cudnn on a GPU in bf16/fp16, else xla) | xla | cudnn
  config.model.attention = "auto"
  # Recompute decoder blocks and MoE layers in the backward pass: none | block | block_dots_saveable (saves
  # weight-matmul outputs). none: the CPU sizes need no recomputation (block's cost: docs/speed.md, remat).
  config.model.remat = "none"
  # Dense baselines matched to the MoE model that model.moe describes (the model has no MoE layer): with its total
  # parameters, "deeper" puts more FFN sublayers where the MoE layers were, "wider" the same sublayers, wider;
  # "flops" puts one expert's FFN there (the compute a token of a top-1 MoE layer).
  config.model.dense_match = "none"  # none | deeper | wider | flops
  # The LM head and its loss in chunks of this many tokens under jax.checkpoint, never writing the float32
  # [tokens, vocabulary] logits (stablemoe_jax/models/head.py; docs/speed.md). 0: off (the whole logits).
  config.model.loss_chunk_tokens = 0
  # Round the embedding's rows up to a multiple of this (128: 50,257 -> 50,304 for GPT-2's BPE); the padded ids are
  # never scored or decoded. 0: off (an old checkpoint restores only with it off, or where it pads nothing).
  config.model.vocab_multiple = 0

  config.model.moe = ml_collections.ConfigDict()
  config.model.moe.enabled = True
  config.model.moe.router = "stablemoe"  # stablemoe | switch | base | hash | deepseek (models/routers.py)
  config.model.moe.num_experts = 8
  config.model.moe.placement = "middle"  # bottom | middle | top | scattered
  config.model.moe.sublayers_per_expert = 2
  config.model.moe.d_ff = 0  # 0 -> model.d_ff
  config.model.moe.capacity_factor = 2.0
  config.model.moe.eval_capacity_factor = 0.0  # <= 0: no token is dropped at evaluation
  # Routing groups G: capacity ceil(cf * T / G / E) per (group, expert); a multiple of the device count. 0: one per
  # device, chosen at launch and recorded with the run (a resumption or evaluation elsewhere routes the same way).
  config.model.moe.num_groups = 0
  config.model.moe.shuffle_tokens = True  # training: random order within a group before capacity (drops random)
  # auto (all_to_all if mesh.expert > 1, else index) | index | all_to_all | grouped | one_hot (benchmark)
  config.model.moe.dispatcher = "auto"
  # Evaluation's: auto (grouped if no token can be dropped and mesh.expert == 1, else as training) | any dispatcher
  config.model.moe.eval_dispatcher = "auto"
  config.model.moe.block_size = 128  # grouped dispatcher: rows per block; each expert's rows padded to a multiple
  # Expert FFN biases: "zeros" (each expert adds exactly 0 at first) | "torch" (the authors' code: PyTorch's default
  # nn.Linear bias U(+-1/sqrt(fan_in)); only the output weight is zeroed). Its probe: docs/tuning_log.md.
  config.model.moe.expert_bias_init = "zeros"
  # Shared experts (DeepSeekMoE): this many always-on expert FFNs (each as one routed expert) that every token goes
  # through, added to the routed output, for any router. 0: none.
  config.model.moe.shared_experts = 0
  # Each router's own settings, read (and validated) only when that router is chosen; setting one of an
  # unselected router is an error. The defaults must equal ROUTERS[name].defaults.
  config.model.moe.stablemoe = ml_collections.ConfigDict()
  config.model.moe.stablemoe.balance_alpha = 0.3  # weight of StableMoE's balance loss
  config.model.moe.stablemoe.centroid_gain = 0.1  # orthogonal-init gain of the routing centroids
  # Which gates the balance loss of expert i acts on: "assigned" (the paper's Eq. 3: the tokens routed to i) or
  # "all" (every token's; a deviation). A preset setting: other routers ignore it without error. What each scope
  # measured in the tuned sweep: docs/tuning.md, "Findings".
  config.model.moe.stablemoe.balance_scope = "all"
  # Deviations probed in docs/tuning.md (off: the paper's router). Router z-loss weight (mean logsumexp(s)^2; 0: off).
  config.model.moe.stablemoe.z_loss_weight = 0.0
  # "dot": s = h . E_i (the paper) | "cosine": s = cos(P h, E_i) / tau, tau learned (X-MoE, Chi et al. 2022).
  # cosine, a preset deviation: the best live seed-0 StableMoE cell of the tuned sweep (docs/tuning.md, "Findings").
  config.model.moe.stablemoe.affinity = "cosine"
  config.model.moe.stablemoe.cosine_dim = 16  # affinity=cosine: P projects h to this many dims (X-MoE: 16); 0: no P
  config.model.moe.stablemoe.cosine_temperature = 0.5  # affinity=cosine: tau's initial value (tutel's 0.5)
  # affinity=cosine: X-MoE's published expert embeddings (torchscale: 1.5): orthogonal init, every row rescaled to
  # this norm after each update (models/cosine_routing.py). 0: off (they start at centroid_gain, never rescaled).
  # Off by the sweep's rule (docs/results.md, "X-MoE's routing as published").
  config.model.moe.stablemoe.cosine_expert_norm = 0.0
  config.model.moe.switch = ml_collections.ConfigDict()
  config.model.moe.switch.balance_weight = 0.01  # weight of N * sum_i f_i P_i (the Switch paper's 0.01)
  config.model.moe.switch.z_loss_weight = 0.0  # router z-loss weight (ST-MoE uses 0.001); 0: off
  config.model.moe.switch.jitter = 0.0  # training-only multiplicative noise U(1-j, 1+j) on the router input; 0: off
  config.model.moe.switch.fixed_routing = False  # True: distil into the distilled router, freeze after stage 1
  # Experts per token: 1 (Switch) | k > 1: the k most probable, their probabilities renormalised (GShard, Mixtral).
  config.model.moe.switch.top_k = 1
  # X-MoE's routing for Switch (the stablemoe section's keys, same meaning): dot | cosine, and cosine's settings.
  config.model.moe.switch.affinity = "dot"
  config.model.moe.switch.cosine_dim = 0
  config.model.moe.switch.cosine_temperature = 0.5
  config.model.moe.switch.cosine_expert_norm = 0.0
  config.model.moe.base = ml_collections.ConfigDict()
  config.model.moe.base.auction_epsilon = 1e-2  # final auction bid step / score span; gap <= T * eps * span
  config.model.moe.base.auction_max_rounds = 1000  # bidding rounds per phase before a balanced fill-in
  config.model.moe.base.centroid_gain = 0.1  # orthogonal-init gain of the expert centroids (fairseq's 0.1)
  config.model.moe.base.fixed_routing = False  # True: distil into the distilled router, freeze after stage 1
  config.model.moe.hash = ml_collections.ConfigDict()
  config.model.moe.hash.table = "random"  # random: seeded table | balanced: bin-packed by train token counts
  config.model.moe.hash.seed = 0  # seed of the table (and of the balanced table's tie order)
  # DeepSeek-V3's auxiliary-loss-free routing: sigmoid affinities, top-k on affinity + a per-expert bias, gates the
  # chosen affinities normalised over the k x routed_scale; after every step each bias moves by
  # bias_update_rate * sign(mean load - load_i), outside the optimizer (models/deepseek_router.py).
  config.model.moe.deepseek = ml_collections.ConfigDict()
  config.model.moe.deepseek.top_k = 2  # experts per token (DeepSeek-V3: 8 of 256)
  config.model.moe.deepseek.routed_scale = 1.0  # factor on the gates (DeepSeek-V3: 2.5)
  config.model.moe.deepseek.bias_update_rate = 1e-3  # gamma of the bias update (DeepSeek-V3: 0.001); 0: none
  config.model.moe.deepseek.balance_weight = 0.0  # the sequence-wise balance loss (DeepSeek-V3: 0.0001); 0: off
  config.model.moe.deepseek.centroid_gain = 0.1  # orthogonal-init gain of the expert centroids
  # The distilled (token-id-only) router of StableMoE and of switch/base with fixed_routing=True.
  config.model.moe.distilled_router = ml_collections.ConfigDict()
  config.model.moe.distilled_router.kind = "embedding"  # embedding | cnn | transformer (all causal)
  config.model.moe.distilled_router.dim = 50  # routing feature dimension (the paper's 50)
  config.model.moe.distilled_router.distill_weight = 1.0  # the paper; the authors' code uses 0.3
  config.model.moe.distilled_router.kernel_size = 3  # kind=cnn: token window, the current token included
  config.model.moe.distilled_router.num_layers = 1  # kind=transformer: layers (the paper tries 1-3)
  config.model.moe.distilled_router.num_heads = 2  # kind=transformer: attention heads (must divide dim)

  config.train = ml_collections.ConfigDict()
  config.train.steps = 850
  # 35% of training (the paper: 10% of 60K steps), the length the headline's seeds trained at; it ends 100 steps
  # before the warmup does, after 614K tokens. The other lengths measured: docs/results.md, Table 6.
  config.train.stage1_steps = 300
  config.train.batch_size = 16
  config.train.microbatches = 1  # >1: accumulate gradients over batch_size / microbatches rows at a time
  config.train.seq_len = 128
  # Chosen on seed-0 validation over lr {1e-3 .. 8e-3} x warmup {40, 400, 600} for this model (configs/tune_cpu.py,
  # results/tune_h100), among the settings whose layer is alive by the health verdict (docs/tuning.md).
  config.train.learning_rate = 6e-3
  config.train.warmup_steps = 400
  config.train.adam_b1 = 0.9
  config.train.adam_b2 = 0.98
  config.train.adam_eps = 1e-8
  config.train.clip_norm = 0.1
  # The learned routers' own parameters (centroids; the cosine router's projection and temperature): their lr is the
  # schedule's x router_lr_scale x min(1, step / router_warmup_steps). 1.0 and 0: the shared optimizer (the paper).
  config.train.router_lr_scale = 1.0
  config.train.router_warmup_steps = 0
  config.train.log_every = 50
  config.train.eval_every = 425
  config.train.eval_batches = 20  # validation batches per in-training evaluation; <= 0: whole split
  config.train.checkpoint_every = 200
  config.train.keep_checkpoints = 3

  # Device mesh (data, expert) over all devices of all processes; data = devices / expert.
  config.mesh = ml_collections.ConfigDict()
  config.mesh.expert = 1  # devices sharing the experts (E / expert each); must divide E and the device count

  config.eval = ml_collections.ConfigDict()
  config.eval.batch_size = 32
  config.eval.seq_len = 128
  # 0 (or eval.seq_len): non-overlapping blocks, mean context ~seq_len / 2. 0 < stride < seq_len: sliding
  # windows advancing by stride, each token scored once with >= seq_len - stride tokens of context.
  config.eval.stride = 0
  # > 0: the final and --mode=eval evaluations score only each split's first N batches (quick checks; the summary
  # says so under "eval"). 0: the whole split, as every reported result.
  config.eval.max_batches = 0

  # Router health (docs/router_health.md): one verdict for every router, on what each MoE layer does. The
  # defaults and descriptions: stablemoe_jax/core/settings (HealthSettings).
  config.health = ml_collections.ConfigDict()
  config.health.min_contribution = 0.01  # dead: removing the layer raises valid perplexity by less than 1%
  config.health.max_top2_load = 0.9  # dead: its two busiest experts take more than 90% of the tokens (N > 2)
  config.health.min_gate_position = 0.05  # warning only: mean gate within 5% of the floor of its attainable range
  config.health.min_load_balance = 0.5  # warning only: load entropy / ln N below this
  config.health.patience = 2  # consecutive log windows (train.log_every steps each) for the load rules
  config.health.after_step = -1  # only windows and evaluation points after this step count; -1: train.warmup_steps
  config.health.on_collapse = "warn"  # warn: print once and train on | stop: stop with an error (exit status 2)
  config.health.contribution_batches = 20  # validation batches of the final contribution measure; <= 0: whole split

  # Routing analysis (README "Routing analysis"): records, fluctuation, cohesion.
  config.analysis = ml_collections.ConfigDict()
  config.analysis.record_every = 25  # record the routing of a fixed validation sample every N steps; 0: never
  config.analysis.sample_tokens = 4096  # that sample: the validation split's first tokens, in rows of train.seq_len
  config.analysis.top_tokens = 10  # cohesion table: the most frequent tokens listed per expert
  config.analysis.report_at_end = True  # after training, write cohesion, load and fluctuation to workdir/analysis
  return config
