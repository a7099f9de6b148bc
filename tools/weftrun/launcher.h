// Runs weftrun's process group: starts the ranks, relays their output, watches
// for failures and signals, stops and restarts the group.
//
//   weft::weftrun::Options o = weft::weftrun::parseOptions(args);
//   return weft::weftrun::launch(o);    // weftrun's exit status
//
// Contract (what the tests check):
//  - each rank is started with fork + execvp in its own process group, stdin
//    from /dev/null, the environment of weftrun plus the WEFT_* / torchrun
//    variables of options.h (replacing any inherited values), and a parent-
//    death signal (SIGKILL) so no rank outlives weftrun even if weftrun itself
//    is killed with SIGKILL;
//  - with tagOutput each rank's stdout and stderr come through pipes and are
//    written whole-line by whole-line to weftrun's stdout and stderr, tagged
//    "[rank] "; otherwise the ranks write to weftrun's stdout/stderr directly;
//  - the first rank to fail (non-zero exit, or killed by a signal) is reported
//    on stderr; the other ranks' process groups get SIGTERM, and SIGKILL once
//    graceSeconds have passed; the attempt's status is the failed rank's exit
//    code, or 128 + its signal;
//  - SIGINT, SIGTERM and SIGHUP received by weftrun are forwarded to every
//    running rank's process group (same escalation to SIGKILL; a second such
//    signal sends SIGKILL at once); the group is not restarted and weftrun's
//    status is 128 + the signal, or the failed rank's status if one had
//    already failed;
//  - after a failure the whole group is started again, up to maxRestarts
//    times, with WEFT_RESTART_COUNT counting the attempts from 0;
//  - a program that cannot be executed stops the group at once with status
//    127 (not found) or 126 (any other exec error), without restarts.
//
// Threading: one thread and one poll() loop; signals reach the loop through a
// self-pipe written by the signal handlers. While launch() runs it owns the
// process's handlers for SIGINT, SIGTERM, SIGHUP and SIGCHLD and ignores
// SIGPIPE (a closed stdout must not kill weftrun before it has stopped its
// ranks); the previous dispositions are restored when it returns. Only one
// launch() may run in a process at a time.
#pragma once

#include "tools/weftrun/options.h"

namespace weft::weftrun {

// Runs the group described by options (options.help must be false) to the
// end, restarts included. Returns the exit status weftrun should exit with.
// Throws std::system_error when the operating system refuses a resource
// (pipe, fork); ranks already started are killed before it propagates.
int launch(const Options& options);

}  // namespace weft::weftrun
