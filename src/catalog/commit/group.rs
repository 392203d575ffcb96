//! Group commit: work for one table that queues behind this process's turn
//! at that table goes in one catalog commit.
//!
//! Each caller puts its work in the table's queue, then waits for the
//! table's turn. Whoever gets the turn takes everything queued (up to a
//! bound) and does it in one commit, answering each member; a member whose
//! work was taken by an earlier turn finds its answer waiting. Under load,
//! the commits that used to run one after another (each reading, writing
//! and swapping the table's metadata) become one per turn, however many
//! callers wait.
//!
//! A member is answered `None` when it should do its work alone: the group
//! commit failed (each member then meets its own error, or succeeds), or
//! the member that took the turn was cancelled before it answered. The
//! work's own checks must make doing it alone after a group safe (the
//! exactly-once evidence of [`crate::catalog::commit::append_once`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedMutexGuard, oneshot};

use crate::catalog::commit::{APPENDS_PER_COMMIT, Landed, OnceAppend};
use crate::rows::Value;

/// Most members whose log rows one append carries.
const ROW_APPENDS_PER_COMMIT: usize = 256;

/// What one process coordinates about its commits to a catalog's tables.
pub(crate) struct Local {
    pub(crate) turns: Turns,
    /// Exactly-once appends waiting for a table ([`crate::catalog::commit::append_once`]).
    pub(crate) once_appends: Groups<OnceAppend, Landed>,
    /// Rows waiting for one of icestage's own tables ([`crate::catalog::bridge::insert::append_rows`]).
    pub(crate) row_appends: Groups<Vec<Vec<Value>>, ()>,
}

impl Default for Local {
    fn default() -> Self {
        Self {
            turns: Turns::default(),
            once_appends: Groups::new("appends", APPENDS_PER_COMMIT),
            row_appends: Groups::new("rows", ROW_APPENDS_PER_COMMIT),
        }
    }
}

/// Named turns: this process's commits to one table wait for each other
/// instead of conflicting and retrying.
#[derive(Default)]
pub(crate) struct Turns(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Turns {
    fn lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.0.lock().expect("turns");
        Arc::clone(turns.entry(key.to_string()).or_default())
    }

    /// The turn at `key`, once the holders before this caller are done.
    pub(crate) async fn exclusive(&self, key: &str) -> OwnedMutexGuard<()> {
        self.lock(key).lock_owned().await
    }

    /// The turn at `key` if no one holds it now.
    pub(crate) fn try_exclusive(&self, key: &str) -> Option<OwnedMutexGuard<()>> {
        self.lock(key).try_lock_owned().ok()
    }
}

/// One queued piece of work and where its answer goes.
pub(crate) struct Member<T, A> {
    pub(crate) work: T,
    answer: oneshot::Sender<Option<A>>,
}

impl<T, A> Member<T, A> {
    /// Answers this member (`None`: do it alone).
    pub(crate) fn answer(self, answer: Option<A>) {
        // A member that stopped waiting (cancelled) needs no answer.
        let _ = self.answer.send(answer);
    }
}

/// The queues of one kind of work, per table.
pub(crate) struct Groups<T, A> {
    /// What the turn's name adds to the table's, so that a group's turn is
    /// not the per-table turn its commit itself takes.
    kind: &'static str,
    /// Most members one commit takes.
    most: usize,
    queued: Mutex<HashMap<String, Vec<Member<T, A>>>>,
}

impl<T, A> Groups<T, A> {
    pub(crate) fn new(kind: &'static str, most: usize) -> Self {
        Self {
            kind,
            most: most.max(1),
            queued: Mutex::default(),
        }
    }

    /// Queues `work` for `table` and waits for its answer: led by this
    /// caller (`lead` does the members' work and answers each) whenever
    /// queued work is waiting when its turn comes. `None`: do it alone.
    pub(crate) async fn join<F, Fut>(
        &self,
        turns: &Turns,
        table: &str,
        work: T,
        mut lead: F,
    ) -> Option<A>
    where
        F: FnMut(Vec<Member<T, A>>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (answer, mut answered) = oneshot::channel();
        self.queued
            .lock()
            .expect("queued")
            .entry(table.to_string())
            .or_default()
            .push(Member { work, answer });
        loop {
            {
                let _turn = turns.exclusive(&self.turn(table)).await;
                let members = self.take(table);
                if !members.is_empty() {
                    // Boxed: the leader's work nests the whole commit's
                    // future inside each caller's.
                    Box::pin(lead(members)).await;
                }
            }
            // Not answered yet: this caller's work was past the bound of the
            // turn it led (callers that stopped waiting leave work queued
            // without a turn to take it), or another leader holds it; the
            // next turn either takes it or finds the answer.
            match answered.try_recv() {
                Ok(answer) => return answer,
                Err(oneshot::error::TryRecvError::Empty) => continue,
                Err(oneshot::error::TryRecvError::Closed) => return None,
            }
        }
    }

    /// The name of the turn that leads `table`'s group.
    pub(crate) fn turn(&self, table: &str) -> String {
        format!("{table} {}", self.kind)
    }

    /// The oldest queued members of `table`, at most [`Self::most`].
    fn take(&self, table: &str) -> Vec<Member<T, A>> {
        let mut queued = self.queued.lock().expect("queued");
        let Some(waiting) = queued.get_mut(table) else {
            return vec![];
        };
        let rest = waiting.split_off(waiting.len().min(self.most));
        let taken = std::mem::replace(waiting, rest);
        if waiting.is_empty() {
            queued.remove(table);
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_member_is_answered_past_the_bound_and_after_one_stops_waiting() {
        let turns = Turns::default();
        let groups: Groups<u32, u32> = Groups::new("test", 1);
        let lead = |members: Vec<Member<u32, u32>>| async move {
            for member in members {
                let work = member.work;
                member.answer(Some(work * 10));
            }
        };
        let busy = turns.exclusive(&groups.turn("t")).await;
        // A member that stops waiting leaves its work queued with no turn
        // to take it.
        let mut gone = Box::pin(groups.join(&turns, "t", 0, lead));
        assert!(futures::poll!(&mut gone).is_pending());
        drop(gone);
        // Three more, one taken per turn.
        let joined = futures::future::join_all((1..=3).map(|n| groups.join(&turns, "t", n, lead)));
        let (answers, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(10), joined),
            async { drop(busy) }
        );
        assert_eq!(
            answers.expect("every member answered"),
            vec![Some(10), Some(20), Some(30)]
        );
        assert!(groups.take("t").is_empty(), "nothing left queued");
    }
}
