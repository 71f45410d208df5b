'use strict';
// n8nbrain: Send Reply — n8n's Send Email (SMTP) node, plus the headers that
// make a message a reply in its thread: In-Reply-To, References and our own
// Message-ID. n8n's Send Email node (2.40, and 2.41) sets no header of our
// choosing, so replies it sends thread by subject only.
//
// It uses what the Send Email node uses: n8n's SMTP credential ("smtp") and
// n8n's own copy of nodemailer, with the same transport settings, the same
// output (nodemailer's answer) and the same errors (nodemailer's message), so
// the workflow tells a refusal from a lost answer the same way.
//
// n8n loads it from N8N_CUSTOM_EXTENSIONS (deploy/n8n/nodes; README.md, "n8n")
// as the node type CUSTOM.n8nbrainSendReply. Plain JavaScript: no build step.
const path = require('path');

// nodemailer, as n8n's Send Email node resolves it: from n8n-nodes-base,
// found from n8n's own entry point (npm's flat and global layouts alike).
function n8nModule(id) {
	const from = require.main && require.main.path ? require.main.path : process.cwd();
	const base = path.dirname(require.resolve('n8n-nodes-base/package.json', { paths: [from] }));
	return require(require.resolve(id, { paths: [base] }));
}

// A message id as RFC 5322 writes it: <left@right>, no space, no brackets
// inside. Anything else is refused with its field's name, never repaired;
// every refusal before the SMTP exchange starts "not sent: ", so the
// workflow reports it failed, not unknown.
const MSG_ID = /^<[^<>\s@]+@[^<>\s@]+>$/;

function messageIds(field, value) {
	const ids = String(value || '').trim().split(/\s+/).filter((s) => s !== '');
	for (const id of ids) {
		if (!MSG_ID.test(id)) {
			throw new Error(`not sent: ${field}: ${JSON.stringify(id.slice(0, 200))} is not a message id (<left@right>)`);
		}
	}
	return ids;
}

// The Send Email node's transport (n8n-nodes-base EmailSend/v2/utils.js).
function transport(nodemailer, c, insecure) {
	const o = { host: c.host, port: c.port, secure: c.secure };
	if (c.secure === false) o.ignoreTLS = c.disableStartTls;
	if (typeof c.hostName === 'string' && c.hostName) o.name = c.hostName;
	if (c.user || c.password) o.auth = { user: c.user, pass: c.password };
	if (insecure === true) o.tls = { rejectUnauthorized: false };
	return nodemailer.createTransport(o, { disableFileAccess: true, disableUrlAccess: true });
}

function nodemailer() {
	try {
		return n8nModule('nodemailer');
	} catch (e) {
		throw new Error(`not sent: n8n's nodemailer was not found from ${require.main && require.main.path}: ${e.message}`);
	}
}

const text = (displayName, name, description, extra) =>
	Object.assign({ displayName, name, type: 'string', default: '', description }, extra || {});

class N8nbrainSendReply {
	constructor() {
		this.description = {
			displayName: 'n8nbrain: Send Reply (SMTP)',
			name: 'n8nbrainSendReply',
			group: ['output'],
			version: 1,
			subtitle: '={{ $parameter["subject"] }}',
			description: 'Sends a plain-text e-mail over SMTP as a reply in its thread (In-Reply-To, References)',
			defaults: { name: 'Send Reply' },
			inputs: ['main'],
			outputs: ['main'],
			credentials: [{ name: 'smtp', required: true }],
			properties: [
				text('From Email', 'fromEmail', 'The sender, e.g. Assistant <assistant@example.com>', { required: true }),
				text('To Email', 'toEmail', 'The recipients, separated by commas', { required: true }),
				text('Subject', 'subject', 'Sent exactly as given'),
				text('Text', 'text', 'The plain-text body, sent exactly as given', { typeOptions: { rows: 5 } }),
				text('In-Reply-To', 'inReplyTo', 'The Message-ID of the message this answers, <left@right>. Empty: a new message, not a reply'),
				text('References', 'references', 'The thread\'s message ids, oldest first, separated by spaces; the one answered last. Empty: the In-Reply-To id'),
				text('Message-ID', 'messageId', 'This message\'s own id, <left@right>. Empty: nodemailer makes one'),
				{ displayName: 'Ignore SSL Issues (Insecure)', name: 'allowUnauthorizedCerts', type: 'boolean', default: false },
			],
		};
	}

	async execute() {
		const credentials = await this.getCredentials('smtp');
		const items = this.getInputData();
		const out = [];
		for (let i = 0; i < items.length; i++) {
			let transporter;
			try {
				const param = (name) => String(this.getNodeParameter(name, i, '') ?? '');
				const inReplyTo = messageIds('In-Reply-To', param('inReplyTo'));
				let references = messageIds('References', param('references'));
				const messageId = messageIds('Message-ID', param('messageId'));
				if (inReplyTo.length > 1 || messageId.length > 1) {
					throw new Error(`not sent: In-Reply-To and Message-ID take one message id each`);
				}
				if (inReplyTo.length === 0 && references.length > 0) {
					throw new Error('not sent: References without In-Reply-To, the message answered');
				}
				if (references.length === 0) references = inReplyTo;
				if (inReplyTo.length === 1 && references[references.length - 1] !== inReplyTo[0]) {
					throw new Error('not sent: References must end with the In-Reply-To id, the message answered');
				}
				transporter = transport(nodemailer(), credentials, this.getNodeParameter('allowUnauthorizedCerts', i, false));
				const info = await transporter.sendMail({
					from: param('fromEmail'),
					to: param('toEmail'),
					subject: param('subject'),
					text: param('text'),
					inReplyTo: inReplyTo[0],
					references: references.length ? references : undefined,
					messageId: messageId[0],
				});
				out.push({ json: info, pairedItem: { item: i } });
			} catch (error) {
				if (this.continueOnFail()) {
					out.push({ json: { error: error.message }, pairedItem: { item: i } });
					continue;
				}
				throw error;
			} finally {
				if (transporter) transporter.close();
			}
		}
		return [out];
	}
}

module.exports = { N8nbrainSendReply };
