//! The protocol as a stateright [`Model`]: which steps each state allows, and what they do.

use stateright::{Model, Property};

use crate::action::Action;
use crate::client::{Answer, Phase};
use crate::config::Config;
use crate::gateway::{Gateway, Job, Step, Verdict};
use crate::ids::{ClientId, Fence, GatewayId, Response};
use crate::properties;
use crate::state::State;
use crate::store::{ClaimOutcome, Completion, Record};
use crate::upstream::Status;

/// The protocol of one variant, within its bounds.
#[derive(Clone, Debug)]
pub struct ProtocolModel {
    /// The variant and the bounds.
    pub config: Config,
}

impl ProtocolModel {
    /// The model of `config`.
    ///
    /// # Panics
    ///
    /// When the bounds are out of the model's range: 1 to 7 gateways and clients, and at most
    /// 7 requests in all (fences are kept in a 7-bit set).
    pub fn new(config: Config) -> Self {
        let requests = u16::from(config.clients) * u16::from(config.requests_per_client);
        assert!(
            (1..=7).contains(&config.gateways) && (1..=7).contains(&config.clients),
            "1 to 7 gateways and clients"
        );
        assert!(
            (1..=7).contains(&requests),
            "1 to 7 requests in all, so at most 7 fences"
        );
        Self { config }
    }

    /// The gateway finishes its job with `answer`: it goes idle and the client hears the
    /// answer if it still waits for that request.
    fn reply(&self, state: &mut State, gateway: GatewayId, job: Job, answer: Answer) {
        state.gateways[usize::from(gateway)] = Gateway::Idle;
        state.clients[usize::from(job.client)].hear(
            job.request,
            answer,
            self.config.requests_per_client,
        );
    }

    /// The gateway holds a fresh claim under `fence`: it sends the request, carrying the fence.
    fn run(state: &mut State, gateway: GatewayId, job: Job, fence: Fence) {
        state.upstream.send(fence);
        state.gateways[usize::from(gateway)] = Gateway::Serving {
            job,
            step: Step::Sent { fence },
        };
    }

    /// A client's request reaches `gateway`, which claims the key.
    fn request(&self, state: &mut State, client: ClientId, gateway: GatewayId) {
        let request = state.clients[usize::from(client)].send();
        let job = Job { client, request };
        match state.store.claim(gateway, self.config.takeover) {
            ClaimOutcome::Claimed(fence) => Self::run(state, gateway, job, fence),
            ClaimOutcome::Busy => self.reply(state, gateway, job, Answer::Busy),
            ClaimOutcome::Done(response) => self.reply(state, gateway, job, Answer::Ok(response)),
            ClaimOutcome::Unknown(fence) if self.config.probe => {
                state.gateways[usize::from(gateway)] = Gateway::Serving {
                    job,
                    step: Step::Probing { fence },
                };
            }
            ClaimOutcome::Unknown(_) => self.reply(state, gateway, job, Answer::OutcomeUnknown),
        }
    }

    /// The gateway's step, by where it is in its job; `None` if `action` is not its next step
    /// (`actions` never offers one that is not).
    fn gateway_step(&self, state: &mut State, gateway: GatewayId, action: Action) -> Option<()> {
        let Gateway::Serving { job, step } = state.gateways[usize::from(gateway)] else {
            return None;
        };
        match (action, step) {
            (Action::Complete { .. }, Step::Answered { fence, response }) => {
                self.complete(state, gateway, job, fence, response);
            }
            (Action::TimeOut { .. }, Step::Sent { fence }) => {
                let takeover = self.config.takeover;
                state.store.release_timed_out(gateway, fence, takeover);
                self.reply(state, gateway, job, Answer::Error);
            }
            (Action::Probe { .. }, Step::Probing { fence }) => {
                self.probe(state, gateway, job, fence)
            }
            (Action::Resolve { .. }, Step::Probed { fence, verdict }) => {
                self.resolve(state, gateway, job, fence, verdict);
            }
            _ => return None,
        }
        Some(())
    }

    /// The holder completes its record with the upstream's answer (rule 5).
    fn complete(
        &self,
        state: &mut State,
        gateway: GatewayId,
        job: Job,
        fence: Fence,
        response: Response,
    ) {
        let completion = state
            .store
            .complete(gateway, fence, response, self.config.late_complete);
        let answer = match completion {
            Completion::Settled => Answer::Ok(response),
            Completion::SettledUnknown => {
                state.seen.late_completed = true;
                Answer::Ok(response)
            }
            // A newer holder or a resolve owns the key: the result is dropped.
            Completion::Fenced => {
                state.seen.fenced_out = true;
                Answer::Error
            }
        };
        self.reply(state, gateway, job, answer);
    }

    /// The prober asks the upstream's status webhook about the key read unknown under `fence`.
    fn probe(&self, state: &mut State, gateway: GatewayId, job: Job, fence: Fence) {
        // The window is read before the upstream is asked: a window that passes only after a
        // "not done" says nothing about a request that executed in between.
        let window_passed = state.upstream.over.contains(fence);
        let verdict = match state.upstream.status() {
            Status::Done(response) => Verdict::Done(response),
            Status::NotDone
                if self.config.window_rule
                    && self.config.window_read_before_probe
                    && !window_passed =>
            {
                // A request of the attempt may still be in transit: ask again later.
                return self.reply(state, gateway, job, Answer::InFlight);
            }
            Status::NotDone => Verdict::NotDone,
        };
        state.gateways[usize::from(gateway)] = Gateway::Serving {
            job,
            step: Step::Probed { fence, verdict },
        };
    }

    /// The prober resolves the record it read unknown under `fence` by the upstream's verdict.
    fn resolve(
        &self,
        state: &mut State,
        gateway: GatewayId,
        job: Job,
        fence: Fence,
        verdict: Verdict,
    ) {
        let guarded = self.config.fence_guarded_resolve;
        match verdict {
            Verdict::Done(response) => {
                state.seen.probe_completed |=
                    state.store.resolve_complete(fence, response, guarded);
                // The upstream's word is the answer, whether this resolve or an earlier one
                // wrote it to the record.
                self.reply(state, gateway, job, Answer::Ok(response));
            }
            // The variant that reads the window only now, after the upstream's "not done".
            Verdict::NotDone
                if self.config.window_rule
                    && !self.config.window_read_before_probe
                    && !state.upstream.over.contains(fence) =>
            {
                self.reply(state, gateway, job, Answer::InFlight);
            }
            Verdict::NotDone => match state.store.resolve_release(fence, gateway, guarded) {
                Some(fresh) => {
                    state.seen.probe_released = true;
                    Self::run(state, gateway, job, fresh);
                }
                // The record moved on under the prober: the retry will see what it is now.
                None => self.reply(state, gateway, job, Answer::InFlight),
            },
        }
    }

    /// Whether `gateway` is the live holder of the record (so a pause can make it late).
    fn is_live_holder(state: &State, gateway: GatewayId) -> bool {
        let held = state.gateways[usize::from(gateway)].held_fence();
        matches!(
            state.store.record,
            Record::Processing { owner, fence, lease_live: true }
                if owner == gateway && Some(fence) == held
        )
    }

    /// Whether the record is under a live lease that no running gateway holds: its holder
    /// crashed, so nothing renews it.
    fn holder_is_gone(state: &State) -> bool {
        let Record::Processing {
            owner,
            fence,
            lease_live: true,
        } = state.store.record
        else {
            return false;
        };
        state.gateways[usize::from(owner)].held_fence() != Some(fence)
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.config)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (client, c) in (0u8..).zip(&state.clients) {
            match c.phase {
                Phase::Ready => {
                    for (gateway, g) in (0u8..).zip(&state.gateways) {
                        if *g == Gateway::Idle {
                            actions.push(Action::Request { client, gateway });
                        }
                    }
                }
                Phase::Waiting => actions.push(Action::GiveUpWaiting { client }),
                Phase::Done(_) | Phase::GaveUp => {}
            }
        }
        for (gateway, g) in (0u8..).zip(&state.gateways) {
            let Gateway::Serving { step, .. } = g else {
                continue;
            };
            match step {
                Step::Sent { fence } => {
                    if self.config.timeout_before_window || state.upstream.over.contains(*fence) {
                        actions.push(Action::TimeOut { gateway });
                    }
                }
                Step::Answered { .. } => actions.push(Action::Complete { gateway }),
                Step::Probing { .. } => actions.push(Action::Probe { gateway }),
                Step::Probed { .. } => actions.push(Action::Resolve { gateway }),
            }
            if state.crashes_left > 0 {
                actions.push(Action::Crash { gateway });
            }
            if state.pauses_left > 0 && Self::is_live_holder(state, gateway) {
                actions.push(Action::Pause { gateway });
            }
        }
        for fence in state.upstream.in_transit.iter() {
            actions.push(Action::Execute { fence });
        }
        // Every attempt's window passes some time after its claim, whether its request is still
        // in transit, executed or dropped: a rule that reads the window at the wrong moment
        // must be able to see it pass after an execution.
        for fence in 1..=state.store.last_fence {
            if !state.upstream.over.contains(fence) {
                actions.push(Action::WindowPasses { fence });
            }
        }
        if Self::holder_is_gone(state) {
            actions.push(Action::LeaseExpires);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Request { client, gateway } => self.request(&mut state, client, gateway),
            Action::Execute { fence } => {
                let response = state.upstream.execute(fence);
                // The answer reaches the sender only if it still waits for it; a crashed or
                // timed-out sender never hears it.
                for gateway in &mut state.gateways {
                    if let Gateway::Serving { step, .. } = gateway
                        && *step == (Step::Sent { fence })
                    {
                        *step = Step::Answered { fence, response };
                    }
                }
            }
            Action::Complete { gateway }
            | Action::TimeOut { gateway }
            | Action::Probe { gateway }
            | Action::Resolve { gateway } => self.gateway_step(&mut state, gateway, action)?,
            Action::WindowPasses { fence } => state.upstream.window_passes(fence),
            Action::GiveUpWaiting { client } => {
                state.clients[usize::from(client)].give_up_waiting(self.config.requests_per_client)
            }
            Action::Crash { gateway } => {
                state.crashes_left -= 1;
                state.gateways[usize::from(gateway)] = Gateway::Idle;
            }
            Action::Pause { .. } => {
                state.pauses_left -= 1;
                state.store.expire();
            }
            Action::LeaseExpires => state.store.expire(),
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(properties::AT_MOST_ONCE, |_, s| properties::at_most_once(s)),
            Property::always(properties::FIRST_ANSWER, |_, s| properties::first_answer(s)),
            Property::sometimes(properties::COMPLETED, |_, s| properties::completed(s)),
            Property::sometimes(properties::CRASHED, |m, s| {
                properties::crashed(s, m.config.crashes)
            }),
            Property::sometimes(properties::PROBE_SETTLES, |_, s| {
                properties::probe_settles(s)
            }),
            Property::sometimes(properties::LATE_COMPLETE, |_, s| {
                properties::late_complete(s)
            }),
            Property::sometimes(properties::FENCED_OUT, |_, s| properties::fenced_out(s)),
            Property::sometimes(properties::LEFT_UNKNOWN, |_, s| properties::left_unknown(s)),
        ]
    }
}
