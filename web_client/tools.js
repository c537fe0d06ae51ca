// Function tools run by this page: the demo tool (off unless chosen in Settings) and what the
// page does with a response's function calls (run them, send each output, ask for the answer).

/** The demo tool, as session.tools takes it. */
export const DEMO_TOOLS = [{
  type: "function",
  name: "get_local_time",
  description: "The current local date and time where the user is, and their time zone.",
  parameters: { type: "object", properties: {} },
}];

const IMPLEMENTATIONS = {
  get_local_time: () => ({
    time: new Date().toLocaleTimeString(),
    date: new Date().toLocaleDateString(),
    time_zone: Intl.DateTimeFormat().resolvedOptions().timeZone,
  }),
};

/** The output text of one call: the function's result as JSON, or {"error": …}. */
export function runCall(name, argumentsJson) {
  const fn = IMPLEMENTATIONS[name];
  if (!fn) return JSON.stringify({ error: `this page has no function ${name}` });
  try {
    return JSON.stringify(fn(JSON.parse(argumentsJson || "{}")));
  } catch (err) {
    return JSON.stringify({ error: String(err) });
  }
}

/** Answer the calls of a completed response: one function_call_output each, then response.create. */
export function answerCalls(connection, calls, onResult) {
  for (const call of calls) {
    const output = runCall(call.name, call.arguments);
    onResult(call, output);
    connection.send({ type: "conversation.item.create", item: { type: "function_call_output", call_id: call.call_id, output } });
  }
  connection.send({ type: "response.create" });
}
