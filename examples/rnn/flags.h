// The command line of the rnn example (main.cpp): its flags, their defaults, the --upstream
// preset and the checks, read through the examples' shared FlagReader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/error.h"
#include "examples/common/app.h"

#include "model.h"

namespace weft::examples::rnn {

inline constexpr const char* kProgram = "rnn";

struct Flags {
  int64_t iterations = 400;
  uint64_t seed = 0;
  int64_t ntoken = 8;
  int64_t ninp = 32;
  int64_t nhid = 64;
  int64_t nlayers = 2;
  int64_t bptt = 20;
  int64_t batchSize = 32;
  double dropout = 0.5;
  double noise = 0.1;
  double lr = 1.0;
  std::string dtype = "float32";
  int64_t logInterval = 50;
  std::string metrics = "rnn_metrics.csv";
  bool checkGradients = false;
  bool upstream = false;
};

[[noreturn]] inline void usage(const std::string& err) {
  app::exitWithUsage(kProgram, err, "weftrun -n 2",
                     "[--iterations N] [--seed N] [--ntoken N] [--ninp N] [--nhid N]\n"
                     "          [--nlayers N] [--bptt N] [--batch-size N] [--dropout P] [--noise P] [--lr X]\n"
                     "          [--dtype float32|float64] [--log-interval N] [--metrics PATH] [--check-gradients] [--upstream]\n"
                     "  (rank 0 is the parameter server \"ps\", rank 1 the trainer)\n");
}

// Flags given explicitly win over --upstream's preset, wherever they stand on the command line.
inline Flags parseFlags(int argc, char** argv) {
  struct Given {
    std::optional<int64_t> iterations, ntoken, ninp, nhid, nlayers, bptt, batchSize;
    std::optional<double> lr;
  } given;
  Flags f;
  app::FlagReader args(argc, argv, usage);
  while (args.next()) {
    const std::string& a = args.flag();
    if (a == "--check-gradients") {
      f.checkGradients = true;
      continue;
    }
    if (a == "--upstream") {
      f.upstream = true;
      continue;
    }
    const std::string& v = args.value();
    if (a == "--iterations") given.iterations = args.integer();
    else if (a == "--seed") f.seed = static_cast<uint64_t>(args.integer());
    else if (a == "--ntoken") given.ntoken = args.integer();
    else if (a == "--ninp") given.ninp = args.integer();
    else if (a == "--nhid") given.nhid = args.integer();
    else if (a == "--nlayers") given.nlayers = args.integer();
    else if (a == "--bptt") given.bptt = args.integer();
    else if (a == "--batch-size") given.batchSize = args.integer();
    else if (a == "--dropout") f.dropout = args.real();
    else if (a == "--noise") f.noise = args.real();
    else if (a == "--lr") given.lr = args.real();
    else if (a == "--dtype") f.dtype = v;
    else if (a == "--log-interval") f.logInterval = args.integer();
    else if (a == "--metrics") f.metrics = v;
    else args.unknown();
  }
  if (f.upstream) {
    // Upstream's sizes: 10 epochs of 5 batches, sequences of 5 tokens, 6 sequences per batch.
    f.iterations = 50;
    f.ntoken = 7;
    f.ninp = 2;
    f.nhid = 3;
    f.nlayers = 4;
    f.bptt = 5;
    f.batchSize = 6;
    f.lr = 0.05;
  }
  f.iterations = given.iterations.value_or(f.iterations);
  f.ntoken = given.ntoken.value_or(f.ntoken);
  f.ninp = given.ninp.value_or(f.ninp);
  f.nhid = given.nhid.value_or(f.nhid);
  f.nlayers = given.nlayers.value_or(f.nlayers);
  f.bptt = given.bptt.value_or(f.bptt);
  f.batchSize = given.batchSize.value_or(f.batchSize);
  f.lr = given.lr.value_or(f.lr);
  if (f.iterations < 1) usage("--iterations must be at least 1");
  if (f.ntoken < 2) usage("--ntoken must be at least 2");
  if (f.ninp < 1 || f.nhid < 1 || f.nlayers < 1) usage("--ninp, --nhid and --nlayers must be at least 1");
  if (f.bptt < 1) usage("--bptt must be at least 1");
  if (f.batchSize < 1) usage("--batch-size must be at least 1");
  if (!(f.dropout >= 0 && f.dropout < 1)) usage("--dropout must be in [0, 1)");
  if (!(f.noise >= 0 && f.noise <= 1)) usage("--noise must be in [0, 1]");
  if (!(f.lr > 0)) usage("--lr must be positive");
  if (f.logInterval < 1) usage("--log-interval must be at least 1");
  try {
    parseDType(f.dtype);
  } catch (const Error& e) {
    usage(e.what());
  }
  return f;
}

}  // namespace weft::examples::rnn
