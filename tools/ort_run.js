#!/usr/bin/env node
// Runs an ONNX model in onnxruntime (the CPU runtime that ships inside the onnxruntime-node
// package) and writes its outputs as JSON.
//
//   node tools/ort_run.js request.json response.json
//
// request.json:  {"model": "path.onnx", "inputs": {"x": {"dims": [1, 3], "data": [..]}}}
// response.json: {"<output name>": {"dims": [..], "data": [..]}, ...}
// Inputs are float32. Errors go to stderr with exit status 1.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

async function main() {
  const [requestPath, responsePath] = process.argv.slice(2);
  if (!requestPath || !responsePath) {
    throw new Error('usage: node tools/ort_run.js request.json response.json');
  }
  const request = JSON.parse(fs.readFileSync(requestPath, 'utf8'));
  const session = await ort.InferenceSession.create(request.model);
  const feeds = {};
  for (const [name, t] of Object.entries(request.inputs)) {
    feeds[name] = new ort.Tensor('float32', Float32Array.from(t.data), t.dims);
  }
  const outputs = await session.run(feeds);
  const response = {};
  for (const [name, t] of Object.entries(outputs)) {
    response[name] = {dims: Array.from(t.dims), data: Array.from(t.data)};
  }
  fs.writeFileSync(responsePath, JSON.stringify(response));
}

main().catch((e) => {
  console.error(`ort_run: ${e.message}`);
  process.exit(1);
});
