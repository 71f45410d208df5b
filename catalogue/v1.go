package catalogue

// Action names of version 1, for code that must refer to a specific action.
const (
	DraftReply      Name = "draft_reply"
	SendReply       Name = "send_reply"
	CreateJob       Name = "create_job"
	EscalateItem    Name = "escalate_item"
	CloseItem       Name = "close_item"
	VerifyReplySent Name = "verify_reply_sent"
	VerifyJob       Name = "verify_job_created"
)

// Priorities lists the priorities every assessment chooses from, lowest first.
func Priorities() []string { return []string{"low", "normal", "high", "urgent"} }

// v1 is the email triage catalogue. PUBLISHED: do not edit. A change in
// meaning is a new action (draft_reply_v2) in a new version.
func v1() Catalogue {
	return Catalogue{
		Version: 1,
		Actions: []Action{
			{
				Name:             DraftReply,
				Product:          "email",
				Description:      "Write a reply draft to the email. Nothing is sent: a human approves, edits or rejects the draft first.",
				RequiresApproval: true,
				Params: []Param{
					{Name: "subject", Type: TypeString, Required: true, MaxLength: 300, OneLine: true, Description: "Subject line of the reply."},
					{Name: "body", Type: TypeString, Required: true, MaxLength: 20000, Description: "Plain-text body of the reply."},
					{Name: "tone", Type: TypeString, MaxLength: 20, Enum: []string{"neutral", "friendly", "formal", "apologetic"}, Description: "Tone the draft was written in."},
				},
			},
			{
				Name:         SendReply,
				Product:      "email",
				Description:  "Send the approved reply. Only the text whose SHA-256 a human approved may be sent.",
				ChangesWorld: true,
				FollowUp:     true,
				Params: []Param{
					{Name: "approval_id", Type: TypeString, Format: FormatUUID, Required: true, Description: "The approval that authorises this text."},
					{Name: "content_sha256", Type: TypeString, Format: FormatSHA256, Required: true, Description: "SHA-256 of the approved subject and body; n8n sends only this text."},
					{Name: "abort_if_replied_since", Type: TypeString, Format: FormatDateTime, Required: true, Description: "Reconciliation: do not send if a reply in the same thread was sent after this time; report closed_manual instead."},
				},
			},
			{
				Name:             CreateJob,
				Product:          "job_management",
				Description:      "Raise a job for the work described in the email.",
				RequiresApproval: true,
				ChangesWorld:     true,
				Params: []Param{
					{Name: "title", Type: TypeString, Required: true, MaxLength: 200, Description: "Short title of the job."},
					{Name: "description", Type: TypeString, Required: true, MaxLength: 5000, Description: "What has to be done."},
					{Name: "site_address", Type: TypeString, MaxLength: 500, Description: "Where, when known."},
					{Name: "external_ref", Type: TypeString, Required: true, MaxLength: 600, FromItem: true, Description: "Reconciliation: the reference a job for this item carries; do not create a job if one with this reference exists, report closed_manual instead."},
				},
			},
			{
				Name:        EscalateItem,
				Description: "Hand the item to a human with the reason. No effect outside the brain.",
				Params: []Param{
					{Name: "reason", Type: TypeString, Required: true, MaxLength: 500, Description: "Why a human must decide."},
				},
			},
			{
				Name:        CloseItem,
				Description: "Close the item: nothing more to do.",
				Params: []Param{
					{Name: "resolution", Type: TypeString, Required: true, MaxLength: 200, Description: "Why the item is closed."},
				},
			},
			{
				Name:        VerifyReplySent,
				Product:     "email",
				Description: "Read back whether the approved reply was sent (after an unknown outcome). Never sends.",
				FollowUp:    true,
				Params: []Param{
					{Name: "approval_id", Type: TypeString, Format: FormatUUID, Required: true, Description: "The approval whose reply to look for."},
					{Name: "content_sha256", Type: TypeString, Format: FormatSHA256, Required: true, Description: "SHA-256 of the text that may have been sent."},
				},
			},
			{
				Name:        VerifyJob,
				Product:     "job_management",
				Description: "Read back whether a job with the reference exists (after an unknown outcome). Never creates one.",
				FollowUp:    true,
				Params: []Param{
					{Name: "external_ref", Type: TypeString, Required: true, MaxLength: 600, Description: "The reference to look for."},
				},
			},
		},
	}
}
