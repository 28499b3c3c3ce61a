//! HARL's parameter agent: an actor-critic over multi-discrete actions, trained with PPO.
//!
//! The paper (sections 4.2-4.3, 6.2) moves a schedule through its parameter space with an actor
//! whose action is one choice per *sub-space* (a tile move, compute-at ±1, parallel ±1, unroll
//! ±1, ...), each sub-space having a no-op, and a critic that estimates the state's value. The
//! reward is the relative change of the cost model's predicted score. Training is PPO with the
//! paper's settings: learning rates 3e-4 (actor) and 1e-3 (critic), γ = 0.9, value-loss weight
//! 0.5, entropy weight 0.01 ([`PpoConfig::default`]).
//!
//! This module knows nothing of schedules: a state is a `Vec<f32>` of fixed length and an action
//! is one index per head of an [`ActionSpace`]; the strategy maps both to
//! a search space's moves ([`crate::space::Moves`]).
//!
//! # Networks
//!
//! * actor: `state → tanh(Linear(hidden)) → tanh(Linear(hidden)) → Linear(Σ heads)`; the last
//!   layer's outputs are split into one softmax per head (a shared torso with one head per
//!   sub-space). Its last layer starts near zero so that the first policy is near uniform.
//! * critic: the same MLP shape ending in one output.
//!
//! Each has its own Adam optimizer with its own learning rate. Both are burn modules on the CPU
//! `flex` backend with autodiff, in f32.
//!
//! # Inference
//!
//! [`Agent::act`], [`Agent::act_batch`] and [`Agent::greedy`] do not go through burn: after
//! construction and after every [`Agent::train`] the weights are copied into a plain-Rust mirror
//! of both networks. It allocates no autodiff graph, is exactly reproducible, and costs about
//! 2 · (d·h + h² + h·Σheads) multiply-adds per state (~0.9 M for 64 states with d = 32,
//! h = 64): ~8 ms in an unoptimised test build, far less where the tuner runs optimised (build
//! scripts with `build-override` opt-level 3). The mirror sums in a different order from burn's
//! matmul, so its log-probabilities differ from burn's in the last bits (tested to agree within
//! 1e-4); PPO's first-epoch ratio is 1 to within that, which the clipping does not notice.
//!
//! # Determinism
//!
//! Same [`PpoConfig::seed`] → same initial weights (drawn from the crate's [`Rng`], not from
//! burn's global generator, which is shared by all threads and would race between agents built
//! concurrently), and same `Rng` → same sampled actions. Training is deterministic on the same
//! machine and build: the flex backend is used without its `rayon` feature, so every reduction
//! runs in a fixed order. Remaining sources of difference, none of which this module can remove:
//! * burn gives each parameter a random [`ParamId`](burn::module::ParamId) (it keys optimizer
//!   state); the ids differ between runs but every update is per parameter, so the numbers do
//!   not depend on them;
//! * if another crate in the build enables burn's `rayon` (or `simd`) feature, Cargo unifies it
//!   into this build and flex may split reductions differently — results stay reproducible run
//!   to run on one machine for `simd`, but not guaranteed bit-identical across thread counts
//!   with `rayon`;
//! * results may differ in the last bits across CPUs (SIMD width, FMA) and compiler versions.

use crate::dense::Dense;
use burn::module::Module;
use burn::nn::Linear;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Tensor, TensorData};
use harl_build::rng::Rng;

/// PPO's hyper-parameters. [`Default`] gives the paper's values (section 6.2) with GAE(λ = 0.95),
/// clip 0.2, 4 epochs per update and 64 hidden units.
#[derive(Clone, Debug, PartialEq)]
pub struct PpoConfig {
    /// Adam learning rate of the actor (paper: 3e-4).
    pub lr_actor: f64,
    /// Adam learning rate of the critic (paper: 1e-3).
    pub lr_critic: f64,
    /// Discount factor γ (paper: 0.9).
    pub gamma: f64,
    /// GAE's λ (0.95).
    pub gae_lambda: f64,
    /// PPO's clip range ε on the probability ratio (0.2).
    pub clip: f64,
    /// Weight of the critic's mean squared error in the loss (paper: 0.5).
    pub value_coef: f64,
    /// Weight of the policy's entropy bonus in the loss (paper: 0.01).
    pub entropy_coef: f64,
    /// Optimisation passes over each batch of trajectories (4).
    pub epochs: usize,
    /// Width of both hidden layers of both networks (64).
    pub hidden: usize,
    /// Seed of the initial weights.
    pub seed: u64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            lr_actor: 3e-4,
            lr_critic: 1e-3,
            gamma: 0.9,
            gae_lambda: 0.95,
            clip: 0.2,
            value_coef: 0.5,
            entropy_coef: 0.01,
            epochs: 4,
            hidden: 64,
            seed: 0,
        }
    }
}

/// A multi-discrete action space: one categorical choice per sub-space ("head").
///
/// `heads[h]` is the number of choices of head `h`; index 0 of every head is its no-op, so every
/// head needs at least one choice. A head of size 1 can only choose its no-op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionSpace {
    /// The number of choices of each head, no-op included.
    pub heads: Vec<usize>,
}

impl ActionSpace {
    /// The total number of choices over all heads (the actor's output width).
    pub fn total(&self) -> usize {
        self.heads.iter().sum()
    }
}

/// One step of a trajectory, as recorded while acting.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The state the action was taken in (length [`Agent::state_dim`]).
    pub state: Vec<f32>,
    /// The action taken: one index per head.
    pub action: Vec<usize>,
    /// The log-probability of `action` under the acting policy (from [`Agent::act`]).
    pub log_prob: f32,
    /// The critic's value of `state` when acting (from [`Agent::act`]).
    pub value: f32,
    /// The reward received for the action.
    pub reward: f32,
    /// Whether the episode ended with this step (no value follows it).
    pub done: bool,
}

/// Losses of one [`Agent::train`] call, each averaged over its epochs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TrainStats {
    /// The clipped surrogate loss (negated objective).
    pub policy_loss: f32,
    /// The critic's mean squared error against the GAE returns.
    pub value_loss: f32,
    /// The policy's entropy (summed over heads, averaged over states).
    pub entropy: f32,
}

/// The actor-critic agent: networks, their optimizers and a plain-Rust mirror for inference.
pub struct Agent {
    config: PpoConfig,
    space: ActionSpace,
    state_dim: usize,
    device: Device,
    actor: Net,
    critic: Net,
    actor_opt: ModuleOptimizer,
    critic_opt: ModuleOptimizer,
    policy: Mlp,
    value: Mlp,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("config", &self.config)
            .field("space", &self.space)
            .field("state_dim", &self.state_dim)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// A fresh agent for states of length `state_dim` and actions in `space`, its weights drawn
    /// from `config.seed`.
    ///
    /// # Panics
    ///
    /// If `space` has no head or a head of size 0 (every head needs its no-op), or if
    /// `state_dim` or `config.hidden` is 0.
    pub fn new(state_dim: usize, space: ActionSpace, config: PpoConfig) -> Self {
        assert!(
            !space.heads.is_empty() && space.heads.iter().all(|&n| n >= 1),
            "ppo: every action space needs at least one head, each with its no-op: {:?}",
            space.heads
        );
        assert!(
            state_dim > 0 && config.hidden > 0,
            "ppo: state_dim ({state_dim}) and hidden ({}) must be positive",
            config.hidden
        );
        let device = Device::flex().autodiff();
        let mut rng = Rng::new(config.seed);
        let hidden = config.hidden;
        // The actor's last layer starts small: a near-uniform first policy explores every move.
        let (actor, policy) = Net::new(state_dim, hidden, space.total(), 0.01, &mut rng, &device);
        let (critic, value) = Net::new(state_dim, hidden, 1, 1.0, &mut rng, &device);
        Agent {
            space,
            state_dim,
            device,
            actor,
            critic,
            actor_opt: AdamConfig::new().init(),
            critic_opt: AdamConfig::new().init(),
            policy,
            value,
            config,
        }
    }

    /// The action space.
    pub fn space(&self) -> &ActionSpace {
        &self.space
    }

    /// The length of a state.
    pub fn state_dim(&self) -> usize {
        self.state_dim
    }

    /// The configuration the agent was built with.
    pub fn config(&self) -> &PpoConfig {
        &self.config
    }

    /// Samples an action for `state` with `rng`: one index per head, the log-probability of the
    /// whole action (the sum over heads) and the critic's value of `state`.
    ///
    /// # Panics
    ///
    /// If `state.len()` is not [`state_dim`](Self::state_dim).
    pub fn act(&self, state: &[f32], rng: &mut Rng) -> (Vec<usize>, f32, f32) {
        self.check_state(state);
        let logits = self.policy.forward(state);
        let value = self.value.forward(state)[0];
        let mut action = Vec::with_capacity(self.space.heads.len());
        let mut log_prob = 0.0f32;
        let mut off = 0;
        for &n in &self.space.heads {
            let lp = log_softmax_slice(&logits[off..off + n]);
            let a = sample(&lp, rng);
            log_prob += lp[a];
            action.push(a);
            off += n;
        }
        (action, log_prob, value)
    }

    /// [`act`](Self::act) for many states (tracks) at once, drawing from `rng` in state order
    /// (so the result equals calling `act` on each state in turn with the same `rng`).
    ///
    /// # Panics
    ///
    /// If a state's length is not [`state_dim`](Self::state_dim).
    pub fn act_batch(&self, states: &[Vec<f32>], rng: &mut Rng) -> Vec<(Vec<usize>, f32, f32)> {
        states.iter().map(|s| self.act(s, rng)).collect()
    }

    /// The most probable choice of each head for `state` (ties go to the lower index, so to the
    /// no-op first).
    ///
    /// # Panics
    ///
    /// If `state.len()` is not [`state_dim`](Self::state_dim).
    pub fn greedy(&self, state: &[f32]) -> Vec<usize> {
        self.check_state(state);
        let logits = self.policy.forward(state);
        let mut off = 0;
        self.space
            .heads
            .iter()
            .map(|&n| {
                let head = &logits[off..off + n];
                off += n;
                argmax(head)
            })
            .collect()
    }

    /// The critic's value of `state`.
    ///
    /// # Panics
    ///
    /// If `state.len()` is not [`state_dim`](Self::state_dim).
    pub fn value(&self, state: &[f32]) -> f32 {
        self.check_state(state);
        self.value.forward(state)[0]
    }

    /// One PPO update on `trajectories` (each in time order).
    ///
    /// Advantages are GAE(γ, λ) within each trajectory, then normalised over the whole batch; the
    /// critic regresses on `advantage + value`. A trajectory whose last step is not `done` was cut
    /// short (a stopped track): its tail is bootstrapped with that last step's own value, the
    /// nearest estimate available of the state that would have followed. The loss is the clipped
    /// surrogate + `value_coef` · MSE − `entropy_coef` · entropy, minimised over the whole batch
    /// for `epochs` passes, each pass one Adam step of each network.
    ///
    /// An empty batch changes nothing and returns zero stats. If the updated weights cannot be
    /// read back from burn (which the CPU backend does not do), the acting policy stays the
    /// previous one and the stats are NaN.
    ///
    /// # Panics
    ///
    /// If a transition's state length is not [`state_dim`](Self::state_dim), or its action does
    /// not have one in-range index per head.
    pub fn train(&mut self, trajectories: &[Vec<Transition>]) -> TrainStats {
        let steps: Vec<&Transition> = trajectories.iter().flatten().collect();
        if steps.is_empty() || self.config.epochs == 0 {
            return TrainStats::default();
        }
        let n = steps.len();
        let total = self.space.total();
        let (advantages, returns) = gae(trajectories, self.config.gamma, self.config.gae_lambda);

        let mut states = Vec::with_capacity(n * self.state_dim);
        let mut onehot = vec![0.0f32; n * total];
        for (i, t) in steps.iter().enumerate() {
            self.check_state(&t.state);
            assert!(
                t.action.len() == self.space.heads.len(),
                "ppo: action {:?} has {} indices for {} heads",
                t.action,
                t.action.len(),
                self.space.heads.len()
            );
            states.extend_from_slice(&t.state);
            let mut off = 0;
            for (&a, &h) in t.action.iter().zip(&self.space.heads) {
                assert!(
                    a < h,
                    "ppo: action {:?} out of range of heads {:?}",
                    t.action,
                    self.space.heads
                );
                onehot[i * total + off + a] = 1.0;
                off += h;
            }
        }
        let old_log_prob: Vec<f32> = steps.iter().map(|t| t.log_prob).collect();
        let advantages: Vec<f32> = normalise(&advantages);
        let returns: Vec<f32> = returns.into_iter().map(|r| r as f32).collect();

        let dev = &self.device;
        let states = Tensor::<2>::from_data(TensorData::new(states, [n, self.state_dim]), dev);
        let onehot = Tensor::<2>::from_data(TensorData::new(onehot, [n, total]), dev);
        let old_log_prob = Tensor::<2>::from_data(TensorData::new(old_log_prob, [n, 1]), dev);
        let advantages = Tensor::<2>::from_data(TensorData::new(advantages, [n, 1]), dev);
        let returns = Tensor::<2>::from_data(TensorData::new(returns, [n, 1]), dev);

        let c = &self.config;
        let mut sums = [0.0f64; 3];
        for _ in 0..c.epochs {
            let log_probs = head_log_probs(self.actor.forward(states.clone()), &self.space.heads);
            let log_prob = (log_probs.clone() * onehot.clone()).sum_dim(1);
            let ratio = (log_prob - old_log_prob.clone()).exp();
            let surr1 = ratio.clone() * advantages.clone();
            let surr2 = ratio.clamp(1.0 - c.clip, 1.0 + c.clip) * advantages.clone();
            let policy_loss = surr1.min_pair(surr2).mean().neg();
            let entropy = (log_probs.clone().exp() * log_probs)
                .sum_dim(1)
                .mean()
                .neg();
            let value_loss = (self.critic.forward(states.clone()) - returns.clone())
                .square()
                .mean();
            let loss = policy_loss.clone() + value_loss.clone().mul_scalar(c.value_coef)
                - entropy.clone().mul_scalar(c.entropy_coef);

            let mut grads = loss.backward();
            let actor_grads = GradientsParams::from_module(&mut grads, &self.actor);
            let critic_grads = GradientsParams::from_module(&mut grads, &self.critic);
            self.actor = self
                .actor_opt
                .step(c.lr_actor, self.actor.clone(), actor_grads);
            self.critic = self
                .critic_opt
                .step(c.lr_critic, self.critic.clone(), critic_grads);

            for (sum, t) in sums.iter_mut().zip([policy_loss, value_loss, entropy]) {
                *sum += f64::from(scalar(t));
            }
        }
        let epochs = c.epochs as f64;
        let stats = TrainStats {
            policy_loss: (sums[0] / epochs) as f32,
            value_loss: (sums[1] / epochs) as f32,
            entropy: (sums[2] / epochs) as f32,
        };
        match (self.actor.mirror(), self.critic.mirror()) {
            (Some(policy), Some(value)) => {
                self.policy = policy;
                self.value = value;
                stats
            }
            _ => TrainStats {
                policy_loss: f32::NAN,
                value_loss: f32::NAN,
                entropy: f32::NAN,
            },
        }
    }

    fn check_state(&self, state: &[f32]) {
        assert!(
            state.len() == self.state_dim,
            "ppo: state of length {} for an agent of state_dim {}",
            state.len(),
            self.state_dim
        );
    }

    /// Burn's log-probabilities of `actions` and values of `states` (to check the mirror).
    #[cfg(test)]
    fn burn_eval(&self, states: &[Vec<f32>], actions: &[Vec<usize>]) -> (Vec<f32>, Vec<f32>) {
        let n = states.len();
        let flat: Vec<f32> = states.iter().flatten().copied().collect();
        let x = Tensor::<2>::from_data(TensorData::new(flat, [n, self.state_dim]), &self.device);
        let lp = head_log_probs(self.actor.forward(x.clone()), &self.space.heads);
        let lp: Vec<f32> = lp.into_data().iter::<f32>().collect();
        let total = self.space.total();
        let log_probs = actions
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let mut off = 0;
                let mut sum = 0.0;
                for (&a, &h) in a.iter().zip(&self.space.heads) {
                    sum += lp[i * total + off + a];
                    off += h;
                }
                sum
            })
            .collect();
        let values = self.critic.forward(x).into_data().iter::<f32>().collect();
        (log_probs, values)
    }
}

/// GAE(γ, λ) advantages and returns (advantage + value) for every step, trajectories flattened
/// in order. A trajectory cut short (last step not `done`) bootstraps with its last value.
fn gae(trajectories: &[Vec<Transition>], gamma: f64, lambda: f64) -> (Vec<f64>, Vec<f64>) {
    let mut advantages = Vec::new();
    let mut returns = Vec::new();
    for traj in trajectories {
        let mut adv = vec![0.0f64; traj.len()];
        let mut next_adv = 0.0f64;
        for t in (0..traj.len()).rev() {
            let step = &traj[t];
            let value = f64::from(step.value);
            let (next_value, carry) = if step.done {
                (0.0, 0.0)
            } else if let Some(next) = traj.get(t + 1) {
                (f64::from(next.value), next_adv)
            } else {
                (value, 0.0)
            };
            let delta = f64::from(step.reward) + gamma * next_value - value;
            next_adv = delta + gamma * lambda * carry;
            adv[t] = next_adv;
        }
        returns.extend(adv.iter().zip(traj).map(|(a, s)| a + f64::from(s.value)));
        advantages.extend(adv);
    }
    (advantages, returns)
}

/// Zero mean, unit standard deviation (all zeros when the values are all equal).
fn normalise(xs: &[f64]) -> Vec<f32> {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let std = var.sqrt() + 1e-8;
    xs.iter().map(|x| ((x - mean) / std) as f32).collect()
}

/// One log-softmax per head over the columns of `logits` (`[batch, Σ heads]`).
fn head_log_probs(logits: Tensor<2>, heads: &[usize]) -> Tensor<2> {
    let mut parts = Vec::with_capacity(heads.len());
    let mut off = 0;
    for &n in heads {
        parts.push(log_softmax(logits.clone().narrow(1, off, n), 1));
        off += n;
    }
    Tensor::cat(parts, 1)
}

/// The value of a one-element tensor (NaN if it cannot be read back).
fn scalar(t: Tensor<1>) -> f32 {
    t.try_into_scalar::<f32>().unwrap_or(f32::NAN)
}

fn log_softmax_slice(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    let log_sum = max + sum.ln();
    logits.iter().map(|&l| l - log_sum).collect()
}

/// Samples an index from log-probabilities by inverting the cumulative distribution.
fn sample(log_probs: &[f32], rng: &mut Rng) -> usize {
    let u = rng.unit();
    let mut cumulative = 0.0f64;
    for (i, &lp) in log_probs.iter().enumerate() {
        cumulative += f64::from(lp.exp());
        if u < cumulative {
            return i;
        }
    }
    log_probs.len() - 1
}

fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

/// A three-layer tanh MLP as a burn module (both the actor and the critic).
#[derive(Module, Debug)]
struct Net {
    l1: Linear,
    l2: Linear,
    out: Linear,
}

impl Net {
    /// A network with weights drawn from `rng`, and its mirror built from the same numbers.
    fn new(
        d_in: usize,
        hidden: usize,
        d_out: usize,
        out_scale: f64,
        rng: &mut Rng,
        device: &Device,
    ) -> (Net, Mlp) {
        let l1 = Dense::random(d_in, hidden, 1.0, rng);
        let l2 = Dense::random(hidden, hidden, 1.0, rng);
        let out = Dense::random(hidden, d_out, out_scale, rng);
        let net = Net {
            l1: l1.to_linear(device),
            l2: l2.to_linear(device),
            out: out.to_linear(device),
        };
        (
            net,
            Mlp {
                layers: [l1, l2, out],
            },
        )
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let h = self.l1.forward(x).tanh();
        let h = self.l2.forward(h).tanh();
        self.out.forward(h)
    }

    /// The current weights as a plain-Rust mirror (`None` if burn cannot read them back).
    fn mirror(&self) -> Option<Mlp> {
        Some(Mlp {
            layers: [
                Dense::from_linear(&self.l1)?,
                Dense::from_linear(&self.l2)?,
                Dense::from_linear(&self.out)?,
            ],
        })
    }
}

/// The plain-Rust mirror of a [`Net`]: tanh after every layer but the last.
#[derive(Clone, Debug)]
struct Mlp {
    layers: [Dense; 3],
}

impl Mlp {
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut h = self.layers[0].forward(x);
        h.iter_mut().for_each(|v| *v = v.tanh());
        let mut h = self.layers[1].forward(&h);
        h.iter_mut().for_each(|v| *v = v.tanh());
        self.layers[2].forward(&h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Two heads of 3; reward 1 exactly when head 0 picks 2 and head 1 picks 1.
    fn bandit_reward(a: &[usize]) -> f32 {
        if a == [2, 1] {
            1.0
        } else {
            0.0
        }
    }

    const STATE: [f32; 4] = [1.0, 0.5, -0.5, 0.25];

    #[test]
    fn learns_a_bandit() {
        let space = ActionSpace { heads: vec![3, 3] };
        let mut agent = Agent::new(
            STATE.len(),
            space,
            PpoConfig {
                seed: 1,
                ..PpoConfig::default()
            },
        );
        let mut rng = Rng::new(2);
        let states = vec![STATE.to_vec(); 32];
        let mut mean_rewards = Vec::new();
        for _ in 0..30 {
            let acts = agent.act_batch(&states, &mut rng);
            let trajs: Vec<Vec<Transition>> = acts
                .into_iter()
                .map(|(action, log_prob, value)| {
                    let reward = bandit_reward(&action);
                    vec![Transition {
                        state: STATE.to_vec(),
                        action,
                        log_prob,
                        value,
                        reward,
                        done: true,
                    }]
                })
                .collect();
            let mean = trajs.iter().map(|t| t[0].reward).sum::<f32>() / trajs.len() as f32;
            mean_rewards.push(mean);
            let stats = agent.train(&trajs);
            assert!(stats.policy_loss.is_finite() && stats.value_loss.is_finite());
            assert!(stats.entropy > 0.0);
        }
        eprintln!("mean reward per update: {mean_rewards:?}");
        let first = mean_rewards[..3].iter().sum::<f32>() / 3.0;
        let last = mean_rewards[mean_rewards.len() - 3..].iter().sum::<f32>() / 3.0;
        assert!(first < 0.3, "started at {first}, expected near 1/9");
        assert!(last > 0.6, "ended at {last}");
        assert_eq!(agent.greedy(&STATE), vec![2, 1]);
    }

    #[test]
    fn same_seed_same_actions() {
        let run = |seed: u64| {
            let space = ActionSpace {
                heads: vec![4, 2, 3],
            };
            let mut agent = Agent::new(
                3,
                space,
                PpoConfig {
                    seed,
                    hidden: 16,
                    ..PpoConfig::default()
                },
            );
            let mut rng = Rng::new(9);
            let states: Vec<Vec<f32>> = (0..8).map(|i| vec![i as f32 * 0.1, 1.0, -0.3]).collect();
            let mut seen = Vec::new();
            for _ in 0..3 {
                let acts = agent.act_batch(&states, &mut rng);
                seen.push(acts.clone());
                let traj: Vec<Transition> = states
                    .iter()
                    .zip(acts)
                    .enumerate()
                    .map(|(i, (s, (action, log_prob, value)))| Transition {
                        state: s.clone(),
                        reward: action[0] as f32 * 0.1,
                        action,
                        log_prob,
                        value,
                        done: i == 7,
                    })
                    .collect();
                agent.train(&[traj]);
            }
            (seen, agent.greedy(&states[0]), agent.value(&states[0]))
        };
        let a = run(5);
        assert_eq!(a, run(5));
        // act_batch draws like act on each state in turn.
        let agent = Agent::new(3, ActionSpace { heads: vec![4, 2] }, PpoConfig::default());
        let states: Vec<Vec<f32>> = (0..5).map(|i| vec![i as f32, 0.5, -1.0]).collect();
        let (mut r1, mut r2) = (Rng::new(11), Rng::new(11));
        let one_by_one: Vec<_> = states.iter().map(|s| agent.act(s, &mut r1)).collect();
        assert_eq!(agent.act_batch(&states, &mut r2), one_by_one);
        assert_ne!(a.2, run(6).2);
    }

    #[test]
    fn head_of_size_one_only_noops() {
        let space = ActionSpace {
            heads: vec![1, 3, 1],
        };
        let mut agent = Agent::new(
            2,
            space,
            PpoConfig {
                hidden: 8,
                ..PpoConfig::default()
            },
        );
        let mut rng = Rng::new(3);
        let states = vec![vec![0.5, -1.0], vec![1.0, 2.0]];
        let acts = agent.act_batch(&states, &mut rng);
        let traj: Vec<Transition> = states
            .iter()
            .zip(acts)
            .map(|(s, (action, log_prob, value))| {
                assert_eq!(action.len(), 3);
                assert_eq!((action[0], action[2]), (0, 0));
                assert!(action[1] < 3 && log_prob.is_finite() && log_prob <= 0.0);
                Transition {
                    state: s.clone(),
                    action,
                    log_prob,
                    value,
                    reward: 1.0,
                    done: false,
                }
            })
            .collect();
        let stats = agent.train(&[traj]);
        assert!(stats.policy_loss.is_finite() && stats.value_loss.is_finite());
        let g = agent.greedy(&states[0]);
        assert_eq!((g.len(), g[0], g[2]), (3, 0, 0));
        assert!(agent.train(&[]) == TrainStats::default());
    }

    #[test]
    fn mirror_matches_burn() {
        let space = ActionSpace {
            heads: vec![5, 1, 3],
        };
        let mut agent = Agent::new(
            6,
            space,
            PpoConfig {
                seed: 4,
                ..PpoConfig::default()
            },
        );
        let mut rng = Rng::new(4);
        let states: Vec<Vec<f32>> = (0..5)
            .map(|i| {
                (0..6)
                    .map(|j| ((i * 7 + j * 3) % 11) as f32 / 5.0 - 1.0)
                    .collect()
            })
            .collect();
        for round in 0..2 {
            let acts = agent.act_batch(&states, &mut rng);
            let actions: Vec<Vec<usize>> = acts.iter().map(|a| a.0.clone()).collect();
            let (lp, v) = agent.burn_eval(&states, &actions);
            for (i, (_, log_prob, value)) in acts.iter().enumerate() {
                assert!(
                    (lp[i] - log_prob).abs() < 1e-4,
                    "round {round}: {} vs {log_prob}",
                    lp[i]
                );
                assert!(
                    (v[i] - value).abs() < 1e-4,
                    "round {round}: {} vs {value}",
                    v[i]
                );
            }
            let traj = acts
                .into_iter()
                .zip(&states)
                .map(|((action, log_prob, value), s)| Transition {
                    state: s.clone(),
                    action,
                    log_prob,
                    value,
                    reward: s[0],
                    done: false,
                })
                .collect();
            agent.train(&[traj]);
        }
    }

    #[test]
    fn gae_by_hand() {
        let t = |reward: f32, value: f32, done: bool| Transition {
            state: vec![],
            action: vec![],
            log_prob: 0.0,
            value,
            reward,
            done,
        };
        // One done step: advantage r - v. A cut trajectory bootstraps with its last value.
        let (adv, ret) = gae(
            &[
                vec![t(1.0, 0.25, true)],
                vec![t(0.0, 1.0, false), t(1.0, 2.0, false)],
            ],
            0.5,
            1.0,
        );
        let tail = 1.0 + 0.5 * 2.0 - 2.0; // 0
        let head = 0.0 + 0.5 * 2.0 - 1.0 + 0.5 * tail; // 0
        let want = [0.75, head, tail];
        for (a, w) in adv.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{adv:?}");
        }
        assert!((ret[0] - 1.0).abs() < 1e-12 && (ret[2] - 2.0).abs() < 1e-12);
    }

    #[test]
    fn timings() {
        fn assert_send<T: Send>() {}
        assert_send::<Agent>();
        let space = ActionSpace {
            heads: vec![13, 3, 3, 3, 3],
        };
        let dim = 32;
        let mut agent = Agent::new(dim, space, PpoConfig::default());
        let mut rng = Rng::new(1);
        let states: Vec<Vec<f32>> = (0..64)
            .map(|i| {
                (0..dim)
                    .map(|j| ((i * 13 + j * 7) % 17) as f32 / 8.0 - 1.0)
                    .collect()
            })
            .collect();
        let t0 = Instant::now();
        let acts = agent.act_batch(&states, &mut rng);
        let act_time = t0.elapsed();
        let traj: Vec<Transition> = states
            .iter()
            .zip(acts)
            .map(|(s, (action, log_prob, value))| Transition {
                state: s.clone(),
                action,
                log_prob,
                value,
                reward: s[1],
                done: false,
            })
            .collect();
        let t0 = Instant::now();
        agent.train(&[traj]);
        let train_time = t0.elapsed();
        eprintln!("act_batch(64 states, dim {dim}): {act_time:?}; train(64 transitions, 4 epochs): {train_time:?}");
    }
}
